"""Is a difference between two arms more than seed noise? The statistics every results table uses, in one place.

- ``summary``: mean and sample standard deviation over seeds (``n - 1`` in the denominator);
- ``paired``: two arms paired by seed (the same batch order and start draws): the per-seed differences,
  their mean and standard deviation, the paired t statistic with its two-sided p, the exact sign-flip p
  (all ``2^n`` sign patterns of the differences; with 5 pairs the smallest possible p is 2/32 = 0.0625),
  and the 95 % interval of the mean difference, ``mean ± t(0.975, n - 1) · sd / sqrt(n)``.

    python experiments/stats.py results/STUDY_A/CELL results/STUDY_B/CELL [--task avg]

prints the per-seed table and the paired figures of two cells' records (``b - a``).
"""
from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.figures import figure  # noqa: E402  (the one rounding rule: evaluate.py prints with it too)


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    sd: float | None  # None for one value

    def text(self, digits: int = 2, sign: bool = False) -> str:
        """``mean ± sd``; ``sign``: a ``+`` on a positive mean, as for a difference. One value is a record's own
        figure, shown by the rule evaluate.py prints it with; a mean and sd of several are rounded once, from
        their full value (rounding them to a record's four decimals first would round twice)."""
        if self.n == 0:
            return "—"
        if self.sd is None:
            return figure(self.mean, digits, sign)
        return f"{self.mean:{'+' if sign else ''}.{digits}f} ± {self.sd:.{digits}f}"


def summary(values: Sequence[float]) -> Summary:
    values = [float(v) for v in values]
    if not values:
        return Summary(0, math.nan, None)
    return Summary(len(values), statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None)


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Two-sided exact p of the mean difference under random signs: the share of the ``2^n`` sign patterns
    whose mean is at least as far from 0 as the observed one."""
    observed = abs(statistics.mean(diffs))
    flips = [abs(statistics.mean(s * d for s, d in zip(signs, diffs)))
             for signs in itertools.product((1, -1), repeat=len(diffs))]
    return sum(f >= observed - 1e-12 for f in flips) / len(flips)


def sign_flip_floor(n: int) -> float:
    """The smallest two-sided sign-flip p that ``n`` pairs allow: 2 of the ``2^n`` patterns, when every difference
    has one sign."""
    return 2 / 2 ** n


@dataclass(frozen=True)
class Paired:
    seeds: list[int]
    diffs: list[float]  # b - a, seed by seed
    mean: float
    sd: float
    t: float
    p_t: float
    p_sign: float
    low: float  # the 95 % interval of the mean difference
    high: float

    def text(self) -> str:
        return (f"{self.mean:+.2f} ± {self.sd:.2f} over {len(self.seeds)} seeds (95 % interval {self.low:+.2f} to "
                f"{self.high:+.2f}); paired t {self.t:.2f}, p {self.p_t:.3f}; exact sign-flip p {self.p_sign:.3f}")


def paired(a: dict[int, float], b: dict[int, float]) -> Paired:
    """``b - a`` over the seeds both hold (seed -> value); at least two are needed."""
    from scipy.stats import t as student

    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        raise ValueError(f"{len(seeds)} seed(s) in both arms; a paired comparison needs 2 or more")
    diffs = [float(b[s]) - float(a[s]) for s in seeds]
    n = len(diffs)
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    p_t = float(2 * student.sf(abs(t), n - 1)) if math.isfinite(t) else 0.0
    half = float(student.ppf(0.975, n - 1)) * se
    return Paired(seeds, diffs, mean, sd, t, p_t, sign_flip_p(diffs), mean - half, mean + half)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import records

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="a cell's folder of records, results/STUDY/CELL (the reference)")
    parser.add_argument("b", type=Path, help="the compared cell's folder (b - a is reported)")
    parser.add_argument("--task", default="avg", help="the test figure compared (default: the seven-task avg)")
    args = parser.parse_args(argv)
    arms = []
    for folder in (args.a, args.b):
        found = {r["seed"]: r["test"][args.task] for r in map(records.load, sorted(folder.glob("seed*.json")))
                 if r["test"] is not None}
        arms.append(found)
    try:
        result = paired(*arms)
    except ValueError as err:
        print(f"error: {args.a} and {args.b}: {err}", file=sys.stderr)
        return 2
    print(f"| seed | {args.a.name} | {args.b.name} | difference |\n|---|---|---|---|")
    for seed, d in zip(result.seeds, result.diffs):
        print(f"| {seed} | {arms[0][seed]:.2f} | {arms[1][seed]:.2f} | {d:+.2f} |")
    print(result.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
