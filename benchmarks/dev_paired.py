"""Grid rows compared on dev at a matched step, seed by seed: for runs that did not all finish, or to ask
what a shorter budget would have chosen.

    python benchmarks/dev_paired.py --up_to 299 "SimCSE=runs/grid/protocol_simcse/base" \\
        "acting DCLR=runs/grid/protocol_dclr/base" [--mechanisms]

Each NAME=DIR is a row of ``seed<S>/`` grid cells, finished or not. A cell's figure is the best
``val/avg_spearman`` (the STS-B dev and SICK-R dev mean, the protocol's selection metric) among its
validations logged at a step <= ``--up_to``; a cell that has not validated at ``--up_to`` yet is left out.
Each later row is paired with the first by seed: the mean and standard deviation of the differences,
and the exact sign-flip test's two-sided p. ``--mechanisms`` adds each row's DCLR diagnostics
(benchmarks/dclr_mechanisms.py) over every logged training step of its cells.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import common
from dclr_mechanisms import TAGS, cell_means
from paired_seeds import sign_flip_p


def dev_curve(cell: Path) -> dict[int, float]:
    """``step -> val/avg_spearman`` of one cell's training logs."""
    return dict(common.scalars(cell / "train", ["val/avg_spearman"]).get("val/avg_spearman", []))


def best_up_to(cell: Path, step: int) -> float | None:
    curve = dev_curve(cell)
    if not any(s >= step for s in curve):
        return None  # not validated at the matched step yet
    return max(v for s, v in curve.items() if s <= step)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+", metavar="NAME=DIR")
    parser.add_argument("--up_to", type=int, required=True, help="the matched step (a logged validation step)")
    parser.add_argument("--mechanisms", action="store_true", help="add the DCLR diagnostics of each row")
    args = parser.parse_args(argv)
    rows: dict[str, dict[int, float]] = {}
    mechanisms: dict[str, dict[str, float]] = {}
    for spec in args.rows:
        name, sep, directory = spec.partition("=")
        if not sep or not Path(directory).is_dir():
            parser.error(f"{spec!r}: expected NAME=DIR with DIR a grid row's directory")
        cells = {int(c.name[4:]): c for c in Path(directory).glob("seed*") if c.name[4:].isdigit()}
        rows[name] = {s: v for s, c in sorted(cells.items()) if (v := best_up_to(c, args.up_to)) is not None}
        if args.mechanisms:
            per_cell = [cell_means(c) for c in cells.values()]
            tags = [t for t in TAGS if any(t in m for m in per_cell)]
            mechanisms[name] = {t: statistics.mean(m[t] for m in per_cell if t in m) for t in tags}
    first = next(iter(rows))
    seeds = sorted(set().union(*rows.values()))
    print(f"best dev mean (STS-B dev + SICK-R dev) / 2 at steps <= {args.up_to}, per seed\n")
    print("| row | " + " | ".join(f"seed {s}" for s in seeds) + f" | mean ± std | paired difference with {first} | sign-flip p |")
    print("|---" * (len(seeds) + 4) + "|")
    for name, values in rows.items():
        cells = " | ".join(f"{values[s]:.2f}" if s in values else "—" for s in seeds)
        mean = (f"{statistics.mean(values.values()):.2f} ± {statistics.stdev(values.values()):.2f}"
                if len(values) > 1 else "—")
        paired = [values[s] - rows[first][s] for s in values if s in rows[first]]
        if name == first or len(paired) < 2:
            diff = p = "—"
        else:
            diff = f"{statistics.mean(paired):+.2f} ± {statistics.stdev(paired):.2f} (n={len(paired)})"
            p = f"{sign_flip_p(paired):.3f}"
        print(f"| {name} | {cells} | {mean} | {diff} | {p} |")
    if mechanisms:
        tags = [t for t in TAGS if any(t in m for m in mechanisms.values())]
        print("\n| row | " + " | ".join(tags) + " |")
        print("|---" * (len(tags) + 1) + "|")
        for name, m in mechanisms.items():
            print(f"| {name} | " + " | ".join(f"{m[t]:.4g}" if t in m else "—" for t in tags) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
