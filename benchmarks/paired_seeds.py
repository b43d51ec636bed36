"""Two grid rows compared seed by seed: per-seed seven-task averages, the paired difference's mean and
standard deviation, a paired t-test and an exact sign-flip test.

    python benchmarks/paired_seeds.py runs/grid/protocol_simcse/base runs/grid/protocol_dclr/base \\
        [--csv docs/results/protocol_per_seed.csv]

Each row is a directory of ``seed<S>/`` grid cells; seeds finished in both rows are paired (seed S of one
with seed S of the other: the same batch order and start draws). ``--csv`` writes every task's per-seed
value of both rows (never over an existing file).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import statistics
import sys
from pathlib import Path

TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "avg")


def finished(row: Path) -> dict[int, dict]:
    out = {}
    for cell in row.glob("seed*"):
        path = cell / "eval.json"
        if path.exists() and cell.name[4:].isdigit():
            results = json.loads(path.read_text())
            if "avg" in results:
                out[int(cell.name[4:])] = results
    return out


def sign_flip_p(diffs: list[float]) -> float:
    """Two-sided exact p of the mean difference under random signs (2^n flips)."""
    observed = abs(statistics.mean(diffs))
    flips = [abs(statistics.mean(s * d for s, d in zip(signs, diffs)))
             for signs in itertools.product((1, -1), repeat=len(diffs))]
    return sum(f >= observed - 1e-12 for f in flips) / len(flips)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="the reference row (e.g. SimCSE)")
    parser.add_argument("b", type=Path, help="the compared row (b - a is reported)")
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args(argv)
    a, b = finished(args.a), finished(args.b)
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        print(f"error: {len(seeds)} seed(s) finished in both {args.a} and {args.b}; need 2 or more", file=sys.stderr)
        return 2
    diffs = [float(b[s]["avg"]) - float(a[s]["avg"]) for s in seeds]
    print(f"| seed | {args.a.parent.name} avg | {args.b.parent.name} avg | difference |\n|---|---|---|---|")
    for s, d in zip(seeds, diffs):
        print(f"| {s} | {float(a[s]['avg']):.2f} | {float(b[s]['avg']):.2f} | {d:+.2f} |")
    from scipy.stats import ttest_rel

    t = ttest_rel([float(b[s]["avg"]) for s in seeds], [float(a[s]["avg"]) for s in seeds])
    print(f"\npaired difference over {len(seeds)} seeds: {statistics.mean(diffs):+.2f} ± {statistics.stdev(diffs):.2f} "
          f"(sd); paired t = {t.statistic:.2f}, p = {t.pvalue:.3f}; exact sign-flip p = {sign_flip_p(diffs):.3f}")
    if args.csv is not None:
        if args.csv.exists():
            parser.error(f"--csv {args.csv} exists; earlier results are never overwritten")
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["row", "seed", *TASKS])
            for row, results in ((args.a, a), (args.b, b)):
                for s in seeds:
                    writer.writerow([str(row), s, *(f"{float(results[s][t]):.4f}" for t in TASKS)])
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
