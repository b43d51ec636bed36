"""Keep freed memory in the process: the allocator tax of a CPU training step, removed in-process.

A training step allocates and frees the same large buffers every step (activations saved for
backward, gradients, the 47 MB word-embedding gradient of a BERT-sized vocabulary). glibc's
malloc serves every block above ``M_MMAP_THRESHOLD`` (128 KiB at start, growing to at most 32 MiB
as blocks are freed) with its own ``mmap`` and unmaps it on ``free``, and trims the heap's top
above ``M_TRIM_THRESHOLD``; the next step faults every page back in, zero-filled by the kernel.
On a fresh process that is tens of thousands of minor page faults a step, and their kernel time
(``benchmarks/train_throughput.py --compare allocator`` counts both; docs/PERFORMANCE.md has the figures). Any PyTorch program on glibc pays it,
sentence-transformers' trainer included; jemalloc or tcmalloc through ``LD_PRELOAD`` is the usual
remedy, which asks the user to install and preload a library.

``keep_freed_memory`` asks glibc itself, through ``mallopt``: no block is served by ``mmap``
(``M_MMAP_MAX = 0``) and the heap is never trimmed (``M_TRIM_THRESHOLD`` at its maximum), so
freed blocks stay in the heap for the next step, as a caching allocator keeps them. The price is
that the process's resident size stays at its peak instead of shrinking after it; a training
process returns to its peak every step anyway. ``train.py`` calls it at start-up
(``--keep_freed_memory false`` turns it off); a library user calls it once before training.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

# glibc's <malloc.h> parameter numbers
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
_TRIM_NEVER = 2**31 - 1  # mallopt takes an int: the largest threshold it can hold

_applied = False


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory for reuse; True where that was done.

    A no-op returning False where the C library is not glibc (macOS, Windows, musl): those
    allocators keep their own policies. Safe to call more than once.
    """
    global _applied
    if _applied:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, _TRIM_NEVER) == 1
    if not ok:
        log.warning("glibc mallopt refused the keep-freed-memory settings; the allocator keeps its defaults")
    _applied = ok
    return ok
