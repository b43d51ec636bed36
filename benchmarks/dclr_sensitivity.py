"""DCLR's sensitivity figure from grid.py cells: STS-B dev and SICK-R dev against phi and against k.

    python benchmarks/dclr_sensitivity.py --out docs/dclr_sensitivity.png \\
        --phi phi=0.5:runs/grid/dclr_phi/phi=0.5/seed42 ... --k k=1:runs/grid/dclr_paper/base/seed42 ...

Each point is LABEL=VALUE:CELL, a grid cell directory holding ``dev.json`` (the dev figures of the
checkpoint the cell scored: the last, or with ``grid.py --select best`` the best). Cells that have not
finished are left out and listed.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def points(specs: list[str]) -> tuple[list[tuple[float, dict]], list[str]]:
    found, missing = [], []
    for spec in specs:
        value, _, cell = spec.partition(":")
        path = Path(cell) / "dev.json"
        if not (Path(cell) / "eval.json").exists() or not path.exists():
            missing.append(cell)
            continue
        found.append((float(value.split("=")[-1]), json.loads(path.read_text())))
    return sorted(found, key=lambda p: p[0]), missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the PNG to write (never overwritten)")
    parser.add_argument("--phi", nargs="+", default=[], metavar="phi=V:CELL")
    parser.add_argument("--k", nargs="+", default=[], metavar="k=V:CELL")
    args = parser.parse_args()
    if Path(args.out).exists():
        parser.error(f"--out {args.out} exists; remove it first (earlier results are never overwritten)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, (name, specs) in zip(axes, (("phi", args.phi), ("k (noise negatives / batch)", args.k))):
        got, missing = points(specs)
        for dev in ("stsb", "sickr"):
            xs = [x for x, d in got if dev in d]
            ax.plot(xs, [d[dev] for x, d in got if dev in d], marker="o", label=f"{dev} dev")
        ax.set_xlabel(name)
        ax.set_ylabel("Spearman x 100")
        print(name, [(x, {k: round(d[k], 2) for k in ("stsb", "sickr") if k in d}) for x, d in got],
              "not finished:", missing)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
