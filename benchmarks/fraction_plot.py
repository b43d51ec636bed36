"""The data-fraction figure of docs/RESULTS.md: STS-B dev and SICK-R dev against the share of training data.

    python benchmarks/fraction_plot.py --out docs/data_fraction.png --start 79.74,75.01 \\
        "SimCSE=runs/grid/protocol_simcse_fraction,runs/grid/protocol_simcse_fraction_small" \\
        --full "SimCSE=runs/grid/protocol_simcse/base/seed42"

Each NAME=DIR[,DIR...] is a series: the cells ``fraction=F/seed*`` of those grids (``dev.json``: the scored
checkpoint's dev figures; several seeds are averaged). ``--full NAME=CELL`` adds the series' 100 % point from
a cell trained on all the data, ``--start STSB,SICKR`` draws the start model's dev figures as dashed lines.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def series_points(grids: list[Path]) -> dict[float, tuple[float, float]]:
    """fraction -> (STS-B dev, SICK-R dev), averaged over the finished seeds of each fraction."""
    found: dict[float, list[tuple[float, float]]] = {}
    for grid in grids:
        for cell in grid.glob("fraction=*/seed*"):
            dev_file = cell / "dev.json"
            if (cell / "eval.json").exists() and dev_file.exists():
                dev = json.loads(dev_file.read_text())
                found.setdefault(float(cell.parent.name.split("=", 1)[1]), []).append((dev["stsb"], dev["sickr"]))
    return {f: (statistics.mean(v[0] for v in vs), statistics.mean(v[1] for v in vs)) for f, vs in sorted(found.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("series", nargs="+", metavar="NAME=DIR[,DIR...]")
    parser.add_argument("--full", action="append", default=[], metavar="NAME=CELL", help="a series' 100 %% cell")
    parser.add_argument("--start", default=None, metavar="STSB,SICKR", help="the start model's dev figures")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_intermixed_args(argv)  # each series may be followed by its --full
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = {}
    for spec in args.full:
        name, _, cell = spec.partition("=")
        dev = json.loads((Path(cell) / "dev.json").read_text())
        full[name] = (dev["stsb"], dev["sickr"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for spec in args.series:
        name, sep, dirs = spec.partition("=")
        if not sep:
            parser.error(f"{spec!r}: expected NAME=DIR[,DIR...]")
        points = series_points([Path(d) for d in dirs.split(",")])
        if name in full:
            points[1.0] = full[name]
        if not points:
            parser.error(f"{spec!r}: no finished fraction=F cell")
        xs = [100 * f for f in points]
        for ax, k in zip(axes, (0, 1)):
            ax.plot(xs, [p[k] for p in points.values()], marker="o", label=name)
    if args.start:
        stsb, sickr = (float(v) for v in args.start.split(","))
        for ax, value in zip(axes, (stsb, sickr)):
            ax.axhline(value, linestyle="--", color="grey", label="start model")
    for ax, title in zip(axes, ("STS-B dev", "SICK-R dev")):
        ax.set_xscale("log")
        ax.set_xlabel("training data (% of the wiki sentences, log scale)")
        ax.set_ylabel("Spearman x 100")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
