"""The markdown tables of docs/RESULTS.md from the runs of benchmarks/results.sh (our rows are grid.py cells).

    python benchmarks/results_table.py [--runs runs/results]

Reads ROW/eval.json (evaluate.py's output), ROW/wall_s and ROW/command for every finished row;
rows run with several seeds (ROW_s42, ROW_s43, ...) are also summarised as mean and standard
deviation. Unfinished rows are listed as such, never filled in.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)
from datamodules.sts import STS_TASKS

TASKS = list(STS_TASKS)
HEADER = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "avg"]
ROWS = [  # (row directory or seed prefix, label)
    ("start", "start model (all-MiniLM-L6-v2), no training"),
    ("nli_softmax", "NLI softmax (SBERT)"),
    ("st_softmax", "  sentence-transformers SoftmaxLoss"),
    ("st_softmax_normalize", "  sentence-transformers SoftmaxLoss, start pipeline's Normalize kept"),
    ("sts_regression_s42", "STS regression on STS-B train (SBERT), seed 42"),
    ("st_cosine", "  sentence-transformers CosineSimilarityLoss"),
    ("triplet", "triplet, Euclidean, margin 1 (SBERT)"),
    ("st_triplet", "  sentence-transformers TripletLoss"),
    ("st_triplet_normalize", "  sentence-transformers TripletLoss, start pipeline's Normalize kept"),
    ("mnr", "MNR on NLI pairs"),
    ("st_mnr", "  sentence-transformers MultipleNegativesRankingLoss"),
    ("mnr_hard_negatives", "MNR with hard negatives (contradictions)"),
    ("simcse_unsup", "unsupervised SimCSE"),
    ("dclr_paper_s42", "DCLR, paper form, seed 42"),
    ("dclr_official", "DCLR, official-code form"),
    ("film_tfidf_cosine", "TF-IDF cosine (no learning)"),
    ("film_tfidf", "FILM over TF-IDF"),
    ("film_frozen_encoder", "FILM over frozen all-MiniLM-L6-v2"),
    ("film_deep_triplet", "FILM deep variant: triplet, frozen transformer + linear head"),
]
SEEDED = [  # (seed-row prefix: PREFIX_s42, PREFIX_s43, ...; label; rows of another name that are seeds too)
    ("sts_regression", "STS regression", []),
    ("dclr_paper", "DCLR, paper form", []),
    ("simcse_unsup", "unsupervised SimCSE", ["simcse_unsup"]),  # seed 42's row is DCLR's complementary model
]


def load(run: Path) -> dict | None:
    """A row's results: ROW/eval.json (peers, FILM) or its grid cell ROW/base/seed*/eval.json (ours)."""
    cells = sorted(run.glob("base/seed*/eval.json"))
    if not (run / "eval.json").is_file() and len(cells) == 1:
        run = cells[0].parent
    if not (run / "eval.json").is_file():
        return None
    results = json.loads((run / "eval.json").read_text())
    scores = [results[t] for t in TASKS]  # Spearman x 100
    wall = (run / "wall_s").read_text().strip() if (run / "wall_s").is_file() else "?"
    command = (run / "command").read_text().strip() if (run / "command").is_file() else "?"
    return {"scores": scores + [sum(scores) / len(scores)], "wall": wall, "command": command}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="runs/results")
    args = parser.parse_args()
    runs = Path(args.runs)
    start = load(runs / "start")
    print("| objective | " + " | ".join(HEADER) + " | Δavg | wall (s) |")
    print("|---" * (len(HEADER) + 3) + "|")
    commands = []
    for row, label in ROWS:
        got = load(runs / row)
        if got is None:
            print(f"| {label} | " + " | ".join(["not run"] + [""] * (len(HEADER) - 1)) + " | | |")
            continue
        delta = got["scores"][-1] - start["scores"][-1] if start else float("nan")
        print(f"| {label} | " + " | ".join(f"{s:.2f}" for s in got["scores"]) + f" | {delta:+.2f} | {got['wall']} |")
        commands.append((label.strip(), got["command"]))
    print("\n| three seeds (42, 43, 44) | " + " | ".join(HEADER) + " |")
    print("|---" * (len(HEADER) + 1) + "|")
    for prefix, label, also in SEEDED:
        seed_runs = [runs / row for row in also] + sorted(runs.glob(f"{prefix}_s*"))
        seeds = [got for run in seed_runs if (got := load(run))]
        listed = {row for row, _ in ROWS}
        commands += [(f"{label}, {run.name}", got["command"]) for run in seed_runs
                     if run.name not in listed and (got := load(run))]
        if len(seeds) < 2:
            print(f"| {label} | " + " | ".join([f"{len(seeds)} seed(s) finished"] + [""] * (len(HEADER) - 1)) + " |")
            continue
        cells = [f"{statistics.mean(c):.2f} ± {statistics.stdev(c):.2f}" for c in zip(*(g["scores"] for g in seeds))]
        print(f"| {label} (n={len(seeds)}) | " + " | ".join(cells) + " |")
    print("\nCommands:")
    for label, command in commands:
        print(f"- {label}: `{command}`")
    print(json.dumps({row: load(runs / row) for row, _ in ROWS if load(runs / row)}))


if __name__ == "__main__":
    main()
