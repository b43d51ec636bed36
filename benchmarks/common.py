"""What the benchmarks share: the machine's description, paired alternating timing, and the record of a run.

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

from harness import provenance  # noqa: E402


def machine(threads: int | None = None) -> dict:
    """The CPU model and its bf16 units, the GPU, cores, torch threads (``harness.provenance``), the torch
    version and the load average when the measurement started."""
    import torch

    return {**provenance.machine(threads or torch.get_num_threads()), "torch": torch.__version__,
            "load_avg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


RECORDS = ROOT / "results" / "benchmarks"


def write_record(name: str, figures: dict[str, float | str], threads: int | None = None, notes: dict | None = None,
                 root: Path = RECORDS) -> Path:
    """The run's record, ``results/benchmarks/<name>/<date>-<processor>.json`` (a second run of a day on the same
    processor gets ``-2``...; nothing is overwritten): the command, the machine (processor and its bf16/AMX units,
    or the GPU; cores and threads), versions, commit and date, the data root (``$SENTEMB_DATA``, which the
    docs print in place of its path), and ``figures``, the numbers a doc may show. ``experiments/report.py`` builds
    the speed tables from these records."""
    import datetime
    import re

    info = machine(threads)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    slug = re.sub(r"[^a-z0-9]+", "-", (info.get("gpu") or info["cpu"]).lower()).strip("-")
    if not info.get("gpu") and info["bf16_units"]:
        slug += "-" + "-".join(u.replace("_", "") for u in info["bf16_units"])
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    path, n = folder / f"{date}-{slug}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{date}-{slug}-{n}.json"
    record = {"schema": 1, "benchmark": name, "command": ["python", *sys.argv], "machine": info,
              "versions": provenance.versions(), "commit": provenance.commit(), "date": date,
              "data_root": os.environ.get("SENTEMB_DATA"), "figures": figures, "notes": notes or {}}
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"record: {path.relative_to(ROOT) if ROOT in path.parents else path}")
    return path


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
