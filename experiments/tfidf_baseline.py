"""Plain TF-IDF cosine on the STS tasks: the baseline FILM over TF-IDF is compared with.

The vectorizer is fitted on exactly the sentences FILM trains on (``FILMDataModule``: the
sentences of the triplets built from ``--train_sources``), with the FILM config's TF-IDF
options, and nothing is learned on top: the score of a pair is the cosine of its two TF-IDF
vectors. The table is ``evaluate.py``'s (SentEval's "all" aggregation, Spearman x 100).

    python experiments/tfidf_baseline.py --sts_dir $SENTEMB_DATA/sts \\
        --train_sources $SENTEMB_DATA/nli/snli.test.tsv $SENTEMB_DATA/nli/mnli.dev_matched.tsv
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from datamodules import STS_TASKS, FILMDataModule  # noqa: E402
from encoders.tfidf import tfidf_features  # noqa: E402
from harness.sts_eval import evaluate_sts, format_table  # noqa: E402


def dense_tfidf(vectorizer, sentences: list[str]) -> torch.Tensor:
    """(N, V) TF-IDF rows over only the V terms these sentences use: cosines are those of the full
    vectors (the dropped columns are zero in every row), without an (N, vocabulary) dense matrix."""
    X = vectorizer.transform(sentences)  # (N, D) CSR, rows L2-normalised
    used = np.unique(X.indices)  # the column (term) ids of the non-zeros
    return torch.from_numpy(X[:, used].toarray())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sts_dir", required=True, help="directory of the STS tasks (as evaluate.py)")
    parser.add_argument("--train_sources", nargs="+", required=True, help="FILM's training sources (NLI or STS pairs)")
    parser.add_argument("--triplets_from", choices=["nli", "sts"], default="nli")
    parser.add_argument("--tasks", nargs="+", choices=STS_TASKS, default=list(STS_TASKS))
    parser.add_argument("--ngram_max", type=int, default=1,
                        help="TF-IDF n-grams 1..ngram_max (FILM: tfidf_ngram_range)")
    parser.add_argument("--min_df", type=int, default=1)
    parser.add_argument("--sublinear_tf", action="store_true")
    parser.add_argument("--output", help="write the results as JSON here (never overwritten)")
    args = parser.parse_args()
    if args.output and os.path.exists(args.output):
        sys.exit(f"error: {args.output}: already exists; choose another --output")

    sentences, _ = FILMDataModule(args.train_sources, triplets_from=args.triplets_from).load_triplets()
    _, vectorizer = tfidf_features(sentences, ngram_range=(1, args.ngram_max), min_df=args.min_df,
                                   sublinear_tf=args.sublinear_tf)
    print(f"TF-IDF fitted on {len(sentences)} sentences: {len(vectorizer.vocabulary_)} terms")
    results = evaluate_sts(lambda s: dense_tfidf(vectorizer, s), args.sts_dir, args.tasks)
    print(format_table({"TF-IDF cosine": results}, args.tasks))
    if args.output:
        with open(args.output, "x") as f:
            json.dump({"model": "tfidf", "train_sources": args.train_sources, **results}, f, indent=2)


if __name__ == "__main__":
    main()
