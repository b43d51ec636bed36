"""What the benchmarks share: the machine's description and paired, alternating timing.

The machines these run on are shared, so an absolute time says little: every benchmark
compares programs measured in the same run, in turns (the order rotates every repetition,
so a slow spell hits each program alike), and reports the median over repetitions of the
per-repetition ratio.
"""
from __future__ import annotations

import os
import platform
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def machine(threads: int | None = None) -> dict:
    """Cores, CPU model, bf16 units, torch version and the torch threads in use."""
    import torch

    flags = cpu_flags()
    return {
        "cores": os.cpu_count(), "cpu": cpu_model(), "torch": torch.__version__,
        "threads": threads or torch.get_num_threads(),
        "bf16_units": sorted(f for f in flags if "bf16" in f or f.startswith("amx")),
        "load_avg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


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


def set_threads(threads: int | None) -> int:
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


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


def scalars(directory: Path, tags: Iterable[str]) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(step, value), ...]`` from every TensorBoard log below ``directory``, the logs in the order they
    were written (a resumed run's later ``version_*`` last); a tag no log holds is absent."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(Path(directory).glob("**/events.out.tfevents.*"), key=os.path.getmtime)
    logs = list(dict.fromkeys(f.parent for f in reversed(files)))[::-1]  # each folder once, at its newest file
    series: dict[str, list[tuple[int, float]]] = {}
    for log in logs:
        acc = EventAccumulator(str(log), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in set(tags) & set(acc.Tags()["scalars"]):
            series.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return series


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median of the per-repetition ratios (paired: both measured in the same repetition)."""
    return statistics.median(a / b for a, b in zip(numerator, denominator))


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}"


class FixedBatches:
    """A batch sampler that yields precomputed batches of indices (a peer trainer handed our batches)."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:  # the trainer calls it each epoch
        pass
