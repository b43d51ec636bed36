"""Every finished cell of some grids as one CSV row: the per-seed figures behind a table of docs/RESULTS.md.

    python benchmarks/grid_csv.py --out docs/results/protocol_cells.csv runs/grid/protocol_simcse \\
        runs/grid/protocol_dev_noise_weighting

Columns: grid, cell (the ``--vary`` values, ``base`` without), seed, the seven test tasks and their average
(empty for a ``--dev_only`` cell), STS-B dev, SICK-R dev and their mean at the scored checkpoint, that
checkpoint's step (empty for the last), and the cell's wall seconds. Never writes over an existing file.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import common  # noqa: F401  (the repository on sys.path)
from datamodules.sts import STS_TASKS

COLUMNS = ["grid", "cell", "seed", *STS_TASKS, "avg", "stsb_dev", "sickr_dev", "dev_mean", "dev_step", "wall_s"]


def cell_row(grid: Path, cell: Path) -> dict[str, str]:
    results = json.loads((cell / "eval.json").read_text())
    dev = json.loads((cell / "dev.json").read_text()) if (cell / "dev.json").exists() else {}
    row = {"grid": grid.name, "cell": cell.parent.name, "seed": cell.name[4:]}
    row.update({t: f"{results[t]:.2f}" if t in results else "" for t in (*STS_TASKS, "avg")})
    row["stsb_dev"] = f"{dev['stsb']:.2f}" if "stsb" in dev else ""
    row["sickr_dev"] = f"{dev['sickr']:.2f}" if "sickr" in dev else ""
    row["dev_mean"] = f"{(dev['stsb'] + dev['sickr']) / 2:.2f}" if {"stsb", "sickr"} <= set(dev) else ""
    row["dev_step"] = "" if dev.get("step") is None else str(dev["step"])
    wall = cell / "wall_s"
    row["wall_s"] = wall.read_text().strip() if wall.exists() else ""
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grids", nargs="+", type=Path, help="grid directories (benchmarks/grid.py's OUT/NAME)")
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write (must not exist)")
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"error: {args.out} exists; it is never overwritten")
    rows = []
    for grid in args.grids:
        if not grid.is_dir():
            raise SystemExit(f"error: {grid}: no such grid directory")
        cells = sorted(grid.glob("*/seed*"), key=lambda c: (c.parent.name, int(c.name[4:]) if c.name[4:].isdigit() else 0))
        rows += [cell_row(grid, c) for c in cells if (c / "eval.json").exists()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} cells -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
