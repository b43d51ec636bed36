"""How do two runs train? Curves of runs from their TensorBoard logs: the plots of notebook 4.

    python experiments/plots.py --out docs/simcse_vs_dclr.png \\
        SimCSE=runs/results/simcse_unsup DCLR=runs/results/dclr_paper_s42 ...

Each NAME=DIR is a run directory (the newest ``lightning_logs/version_*`` below it is used, or DIR
itself when it holds the event files). The figure has one panel per tag, every run on each.
"""
from __future__ import annotations

import argparse
from pathlib import Path

TAGS = ("val/stsb_spearman", "val/alignment", "val/uniformity")


def event_dir(directory: str) -> str:
    path = Path(directory)
    if list(path.glob("events.out.tfevents.*")):
        return str(path)
    versions = sorted(path.glob("lightning_logs/version_*"), key=lambda p: p.stat().st_mtime)
    if not versions:
        raise FileNotFoundError(f"{directory}: no TensorBoard event files and no lightning_logs/version_* below it")
    return str(versions[-1])


def read_curves(runs: dict[str, str], tags: tuple[str, ...] = TAGS) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{run name: {tag: [(step, value), ...]}} read from the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    curves = {}
    for name, directory in runs.items():
        ea = EventAccumulator(event_dir(directory), size_guidance={"scalars": 0})
        ea.Reload()
        missing = [t for t in tags if t not in ea.Tags()["scalars"]]
        if missing:
            raise KeyError(f"{directory}: the logs hold no {missing}")
        curves[name] = {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in tags}
    return curves


def plot_curves(curves: dict[str, dict[str, list[tuple[int, float]]]], tags: tuple[str, ...] = TAGS):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tags), figsize=(4.3 * len(tags), 3.5))
    for name, series in curves.items():
        for ax, tag in zip(axes, tags):
            steps, values = zip(*series[tag])
            ax.plot(steps, values, marker="o", label=name)
            ax.set_title(tag)
            ax.set_xlabel("optimizer step")
    axes[0].legend()
    fig.tight_layout()
    return fig


def diagnostics(directory: str, prefix: str = "train/") -> dict[str, tuple[float, float, float]]:
    """(first, mean, last) of every scalar under ``prefix`` in a run's logs (e.g. DCLR's masking
    and noise figures)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(event_dir(directory), size_guidance={"scalars": 0})
    ea.Reload()
    out = {}
    for tag in sorted(t for t in ea.Tags()["scalars"] if t.startswith(prefix)):
        values = [e.value for e in ea.Scalars(tag)]
        out[tag] = (values[0], sum(values) / len(values), values[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="the PNG to write (never overwritten)")
    parser.add_argument("--diagnostics", action="store_true",
                        help="print (first, mean, last) of each run's train/ scalars instead of plotting")
    parser.add_argument("runs", nargs="+", help="NAME=DIR")
    args = parser.parse_args()
    runs = dict(item.split("=", 1) for item in args.runs)
    if args.diagnostics:
        for name, directory in runs.items():
            print(f"| {name} | first | mean | last |\n|---|---|---|---|")
            for tag, (first, mean, last) in diagnostics(directory).items():
                print(f"| {tag} | {first:.4g} | {mean:.4g} | {last:.4g} |")
        return
    if not args.out:
        parser.error("--out is required to plot")
    if Path(args.out).exists():
        parser.error(f"--out {args.out} exists; remove it first (earlier results are never overwritten)")
    curves = read_curves(runs)
    import matplotlib

    matplotlib.use("Agg")
    plot_curves(curves).savefig(args.out, dpi=110)
    for name, series in curves.items():
        print(name, {tag: (round(v[0][1], 4), round(v[-1][1], 4)) for tag, v in series.items()}, "(first, last)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
