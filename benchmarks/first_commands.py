"""How long do a newcomer's two commands take, and how much disk do they leave? ``make quickstart`` (and, with
``--tests``, ``make test``) timed in a fresh clone of this repository, with the Python that runs this script.

    python benchmarks/first_commands.py [--tests]

The clone is made from the checkout's HEAD into a temporary folder; its install step is skipped (the running
Python already has the package's requirements: ``.make-installed`` is touched), so the time is the command's own.
The record (``results/benchmarks/first_commands/``) holds the wall seconds, the run directory's size in MB, the
number of tests with ``--tests``, and the load average of the machine at the start and the end, since the
figures are only comparable on a machine as loaded; README.md's first block is generated from it.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_record  # noqa: I001 (sets sys.path)

ROOT = Path(__file__).resolve().parents[1]


def folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6


def timed(command: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed in {cwd} (exit {done.returncode}):\n"
                         f"{(done.stdout + done.stderr)[-2000:]}")
    return time.perf_counter() - start, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", action="store_true", help="also time make test (the whole suite)")
    args = parser.parse_args()
    figures: dict[str, float | str] = {"load_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        (clone / ".make-installed").touch()
        make = ["make", f"PYTHON={sys.executable}"]
        seconds, _ = timed([*make, "quickstart"], clone)
        figures["quickstart_s"] = round(seconds, 1)
        figures["quickstart_mb"] = round(folder_mb(clone / "runs" / "quickstart"), 1)
        if args.tests:
            seconds, out = timed([*make, "test"], clone)
            found = re.search(r"(\d+) passed", out)
            figures["tests_s"] = round(seconds, 1)
            figures["tests_passed"] = float(found.group(1)) if found else float("nan")
    figures["load_end"] = round(os.getloadavg()[0], 2)
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    write_record("first_commands", figures, notes={"clone_of": "HEAD"})  # prints its path


if __name__ == "__main__":
    main()
