"""What the benchmarks share: paired alternating timing, child processes, and (from ``harness.measurement``) the
machine's description and the record of a run.

The machines these run on are shared, so an absolute time says little: every benchmark
compares programs measured in the same run, in turns (the order rotates every repetition,
so a slow spell hits each program alike), and reports the median over repetitions of the
per-repetition ratio.
"""
from __future__ import annotations

import os
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# shared with the studies in experiments/ from the layer below both (benchmarks never import experiments, nor they us)
from harness.measurement import RECORDS, FixedBatches, machine, set_threads, write_record  # noqa: E402,F401


def print_machine(info: dict) -> None:
    print(f"machine: {info['cores']} cores, {info['cpu']}, torch {info['torch']}, {info['threads']} torch threads, "
          f"bf16 units: {', '.join(info['bf16_units']) or 'none'}, load average {info['load_avg_1min']}")


def run_child(cmd: list[str], what: str) -> dict:
    """Run a benchmark's child process; its result is the last stdout line that is a JSON object.

    A fresh process per measurement keeps one program's allocator and caches from another's;
    a failure stops the benchmark with the child's stderr.
    """
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{what} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(lines[-1])


class Timings:
    """Wall-clock and process CPU seconds per repetition of each program.

    CPU seconds are a second opinion on a crowded machine: with one torch thread they do not
    count the time the process waited for a core; with more threads they include spin-waiting.
    """

    def __init__(self, names: list[str]) -> None:
        self.wall: dict[str, list[float]] = {n: [] for n in names}
        self.cpu: dict[str, list[float]] = {n: [] for n in names}


def alternate(programs: dict[str, Callable[[], object]], reps: int) -> Timings:
    """Run the programs in turns, the order rotated every repetition."""
    names = list(programs)
    timings = Timings(names)
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            wall, cpu = time.perf_counter(), time.process_time()
            programs[name]()
            timings.wall[name].append(time.perf_counter() - wall)
            timings.cpu[name].append(time.process_time() - cpu)
    return timings


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median of the per-repetition ratios (paired: both measured in the same repetition)."""
    return statistics.median(a / b for a, b in zip(numerator, denominator))


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}"
