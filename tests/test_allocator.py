"""harness.allocator: freed memory stays in the process (glibc), so the next step does not fault it in again."""
import platform
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBE = r"""
import ctypes, sys
sys.path.insert(0, {root!r})
from harness.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
page = 4096
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
size = 64 << 20
before = rss()
block = libc.malloc(size)
ctypes.memset(block, 1, size)  # touch every page
libc.free(block)
print(applied, (rss() - before) / size)
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_block_stays_resident_only_when_kept():
    def probe(mode):
        out = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT)), mode], capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0] == "True", float(out[1])

    applied, kept_share = probe("keep")
    assert applied
    assert kept_share > 0.9  # the freed 64 MB block is still in the process, ready for reuse
    applied, default_share = probe("default")
    assert not applied
    assert default_share < 0.1  # glibc's default: the block was mmapped and unmapped on free
