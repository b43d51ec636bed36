"""How much each DCLR mechanism acts, per row of grid cells: the mechanisms table of docs/RESULTS.md.

    python benchmarks/dclr_mechanisms.py "DCLR, paper form=runs/grid/dclr_paper/base" \\
        "unsupervised SimCSE=runs/grid/simcse/base"

Each NAME=DIR is a grid row: its ``seed*/`` cells are read (or DIR itself when it is one cell). For every
``train/<tag>`` below, a cell's figure is the mean over its logged steps; the row's is the mean over its
finished cells, printed as a markdown table (``—``: the row never logs the tag).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import common

TAGS = ("noise_step_norm", "noise_cos_shift", "masked_fraction", "noise_masked_fraction", "threshold",
        "kept_comp_cosine", "uniformity")


def cell_means(cell: Path, tags: tuple[str, ...] = TAGS) -> dict[str, float]:
    """The mean over the logged steps of each ``train/<tag>`` of one cell's training logs."""
    series = common.scalars(cell / "train", [f"train/{tag}" for tag in tags])
    return {tag: statistics.mean(v for _, v in series[f"train/{tag}"]) for tag in tags if series.get(f"train/{tag}")}


def row_means(directory: Path) -> tuple[dict[str, float], list[str]]:
    """The mean over a row's finished cells of each cell's means, and the seeds read."""
    cells = [directory] if (directory / "train").is_dir() else sorted(directory.glob("seed*"))
    cells = [c for c in cells if (c / "eval.json").exists()]
    per_cell = [cell_means(c) for c in cells]
    tags = {t for m in per_cell for t in m}
    return {t: statistics.mean(m[t] for m in per_cell if t in m) for t in tags}, [c.name for c in cells]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+", metavar="NAME=DIR")
    args = parser.parse_args(argv)
    lines = ["| run (cells) | " + " | ".join(f"`{t}`" for t in TAGS) + " |", "|---" * (len(TAGS) + 1) + "|"]
    for spec in args.rows:
        name, sep, directory = spec.rpartition("=")
        if not sep or not Path(directory).is_dir():
            parser.error(f"{spec!r}: expected NAME=DIR with DIR a grid row or cell directory")
        means, seeds = row_means(Path(directory))
        cells = ", ".join(seeds) or "none finished"
        lines.append(f"| {name} ({cells}) | " + " | ".join(f"{means[t]:.3g}" if t in means else "—" for t in TAGS) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
