"""What a study and a speed benchmark share when they measure: the machine a figure was made on, torch's
threads, the record a run leaves in ``results/benchmarks/``, and fixed batches handed to a peer trainer.

``experiments/`` and ``benchmarks/`` both import this, never each other.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import provenance

RECORDS = provenance.ROOT / "results" / "benchmarks"


def machine(threads: int | None = None) -> dict:
    """The CPU model and its bf16 units, the GPU, cores, torch threads (``harness.provenance``), the torch
    version and the load average when the measurement started."""
    import torch

    return {**provenance.machine(threads or torch.get_num_threads()), "torch": torch.__version__,
            "load_avg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads when ``threads`` is given; the number in use either way."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def in_clone(words: list[str]) -> list[str]:
    """A command line with this clone's paths relative to its root, so that a record names the same command
    wherever the clone lies (the campaign passes absolute paths)."""
    return [word.replace(str(provenance.ROOT) + "/", "") for word in words]


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
    record = {"schema": 1, "benchmark": name, "command": ["python", *in_clone(sys.argv)], "machine": info,
              "versions": provenance.versions(), "commit": provenance.commit(), "date": date,
              "data_root": os.environ.get("SENTEMB_DATA"), "figures": figures, "notes": notes or {}}
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    root_dir = provenance.ROOT
    print(f"record: {path.relative_to(root_dir) if root_dir in path.parents else path}")
    return path


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
