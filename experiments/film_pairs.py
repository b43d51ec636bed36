"""FILM's duplicate detection (Tang & Aw 2020) as one command: labelled pairs in, a table out.

Steps, each timed:

1. Labelled pairs ``sentence1, sentence2, label`` (1 = duplicate) for fit, validation and test.
   ``--train/--val/--test`` take any pair source (``datamodules.pairs.load_labelled_pairs``):
   Quora Question Pairs from the hub as ``nyu-mll/glue:qqp:train`` (GLUE's parquet; its columns
   question1, question2 are mapped); QQP's test split is unlabelled, so there take
   ``--test nyu-mll/glue:qqp:validation`` and carve validation out of train with ``--val_fraction``.
   Offline, ``--sts_dir DIR`` builds them from STS-B's published splits (train = fit, dev =
   validation, test = test) by a fixed rule: gold >= 4 of 5 a duplicate, gold <= 1 not, the
   pairs in between dropped.
2. TF-IDF fitted on the training sentences (each distinct sentence once).
3. Triplets from a clustering of the labelled training pairs: the connected components of the
   positive pairs are groups (``datamodules.triplets.groups_from_pairs``), and each sentence of a
   group of two or more anchors ``--n_per_anchor`` (anchor, same group, other group) triplets
   (``triplets_from_groups``). Negative pairs only make their sentences singletons: negatives are
   drawn from all other groups.
4. M-FILM (the FILM solver with ``minibatch``) fitted on those triplets over TF-IDF, and again over
   frozen ``--model`` embeddings (all-MiniLM-L6-v2 by default; ``--model none`` skips every
   encoder row).
5. Pairwise kNN in the learned space (``harness.pair_knn``): a test pair is a duplicate when each
   sentence is among the other's k nearest neighbours in the pool of all the test sentences; k
   is chosen on validation by cross-entropy (``select_k``), and the log loss is that of the
   smoothed vote ``knn_match_proba``.

Baselines in the same table: the majority class of the training pairs; cosine of TF-IDF and of
the frozen encoder with the threshold that maximises validation accuracy (its log loss from a
logistic fit of the cosine on validation, Platt scaling); kNN over the raw features, without
FILM, to show what the metric adds.

Why a plain argparse script and not a LightningCLI config: nothing here is a Lightning fit
(no batches, checkpoints or resumption; FILM's solver runs to its step budget in seconds), the
other benchmarks are argparse scripts, and every default sits in one place, below, where
``--help`` prints it. Results as JSON with ``--output`` (never overwritten).

    OMP_NUM_THREADS=1 python experiments/film_pairs.py --sts_dir $SENTEMB_DATA/sts
    python experiments/film_pairs.py --train nyu-mll/glue:qqp:train --val_fraction 0.05 \\
        --test nyu-mll/glue:qqp:validation --max_pairs 20000
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from harness.provenance import machine  # noqa: E402
from datamodules.pairs import LabelledPairs, load_labelled_pairs, sts_duplicate_pairs  # noqa: E402
from datamodules.triplets import groups_from_pairs, triplets_from_groups  # noqa: E402
from encoders.tfidf import tfidf_features  # noqa: E402
from harness.pair_knn import knn_match_proba, knn_pair_match, select_k  # noqa: E402
from lightning_modules.film_solver import FILM  # noqa: E402

SPLITS = ("train", "val", "test")


class Steps:
    """Wall-clock seconds of each named step, in order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str):
        steps = self

        class _Timer:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                steps.seconds[name] = steps.seconds.get(name, 0.0) + time.perf_counter() - self.t0

        return _Timer()


def load_splits(args: argparse.Namespace) -> dict[str, LabelledPairs]:
    if args.sts_dir:
        files = {"train": "stsb.train.tsv", "val": "stsb.dev.tsv", "test": "stsb.test.tsv"}
        splits = {s: sts_duplicate_pairs(os.path.join(args.sts_dir, f)) for s, f in files.items()}
    else:
        splits = {"train": load_labelled_pairs(args.train), "test": load_labelled_pairs(args.test)}
        if args.val:
            splits["val"] = load_labelled_pairs(args.val)
        else:  # a seeded share of the training pairs
            rows = list(zip(*splits["train"]))
            random.Random(args.seed).shuffle(rows)
            cut = max(1, round(len(rows) * args.val_fraction))
            splits["val"] = LabelledPairs(*map(list, zip(*rows[:cut])))
            splits["train"] = LabelledPairs(*map(list, zip(*rows[cut:])))
    if args.max_pairs:
        for name, pairs in splits.items():
            if len(pairs.label) > args.max_pairs:
                keep = sorted(random.Random(args.seed).sample(range(len(pairs.label)), args.max_pairs))
                splits[name] = LabelledPairs(*([col[i] for i in keep] for col in pairs))
    return {s: splits[s] for s in SPLITS}


def index_pairs(pairs: LabelledPairs) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Distinct sentences, (n_pairs, 2) indices into them, and the (n_pairs,) labels."""
    ids: dict[str, int] = {}
    idx = [(ids.setdefault(a, len(ids)), ids.setdefault(b, len(ids))) for a, b in zip(pairs.sentence1, pairs.sentence2)]
    return list(ids), np.asarray(idx, dtype=np.int64).reshape(-1, 2), np.asarray(pairs.label, dtype=np.int64)


def dense_columns_used(X) -> torch.Tensor:
    """(n, V) dense rows over only the V terms these rows use: dot products and cosines are those of
    the full TF-IDF vectors, without an (n, vocabulary) dense matrix."""
    return torch.from_numpy(X[:, np.unique(X.indices)].toarray())


def metrics(y: np.ndarray, pred: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    y, pred = y.astype(bool), pred.astype(bool)
    tp, fp, fn = int((pred & y).sum()), int((pred & ~y).sum()), int((~pred & y).sum())
    p = np.clip(proba.astype(np.float64), 1e-12, 1 - 1e-12)
    return {"accuracy": float((pred == y).mean()), "f1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0,
            "log_loss": float(-(y * np.log(p) + (~y) * np.log(1 - p)).mean())}


def cosines(emb: torch.Tensor, idx: np.ndarray) -> np.ndarray:
    e = torch.nn.functional.normalize(emb.double(), dim=-1)
    return (e[idx[:, 0]] * e[idx[:, 1]]).sum(-1).numpy()  # (n_pairs,)


def best_threshold(scores: np.ndarray, y: np.ndarray) -> float:
    """The threshold (score >= t is a duplicate) with the highest validation accuracy; ties: the lowest."""
    s = np.unique(scores)
    candidates = np.concatenate([[s[0] - 1e-9], (s[:-1] + s[1:]) / 2, [s[-1] + 1e-9]])
    accuracy = [((scores >= t) == y.astype(bool)).mean() for t in candidates]
    return float(candidates[int(np.argmax(accuracy))])


def cosine_row(name: str, emb: dict[str, torch.Tensor], idx: dict, y: dict) -> dict:
    """Cosine with a validation-tuned threshold; probability from a logistic (Platt) fit on validation."""
    from sklearn.linear_model import LogisticRegression

    val, test = cosines(emb["val"], idx["val"]), cosines(emb["test"], idx["test"])
    t = best_threshold(val, y["val"])
    platt = LogisticRegression(C=1e6).fit(val[:, None], y["val"])
    val_ll = metrics(y["val"], val >= t, platt.predict_proba(val[:, None])[:, 1])["log_loss"]
    return {"method": name, "choice": f"threshold {t:.3f}", "val_log_loss": val_ll,
            **metrics(y["test"], test >= t, platt.predict_proba(test[:, None])[:, 1])}


def knn_row(name: str, emb: dict[str, torch.Tensor], idx: dict, y: dict, candidates: list[int]) -> dict:
    """Mutual kNN with k chosen on validation by cross-entropy."""
    a, b = (emb["val"][idx["val"][:, c]] for c in (0, 1))
    k, ce = select_k(a, b, y["val"], candidates)
    a, b = (emb["test"][idx["test"][:, c]] for c in (0, 1))
    pred = knn_pair_match(a, b, k).numpy()
    return {"method": name, "choice": f"k = {k}", "val_log_loss": ce[k],
            **metrics(y["test"], pred, knn_match_proba(a, b, k).numpy())}


def fit_film(features: object, triplets: torch.Tensor, dim: int, rank: int | None, args) -> FILM:
    film = FILM(dim=dim, rank=rank, margin=args.margin, l2=args.l2, max_iter=args.steps, minibatch=args.minibatch,
                minibatch_step=args.minibatch_step, seed=args.seed)
    return film.fit(features, triplets)


def fmt_table(rows: list[dict], seconds: dict[str, float]) -> str:
    lines = ["| method | chosen on validation | val log loss | test accuracy | test F1 | test log loss | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['choice']} | {r['val_log_loss']:.3f} | {100 * r['accuracy']:.2f} | "
                     f"{100 * r['f1']:.2f} | {r['log_loss']:.3f} | {r['fit_s']:.1f} |")
    lines += ["", "seconds: every step the row needs (features, triplets, FILM, choosing on validation, labelling "
              "test), from the table of steps:", "", "| step | seconds |", "|---|---|"]
    lines += [f"| {name} | {s:.1f} |" for name, s in seconds.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sts_dir", help="offline: STS-B's train/dev/test (stsb.*.tsv) by the gold >= 4 / <= 1 rule")
    p.add_argument("--train", help="labelled pair source for fitting (file or hub split, e.g. nyu-mll/glue:qqp:train)")
    p.add_argument("--val", help="labelled pair source for choosing k and thresholds")
    p.add_argument("--test", help="labelled pair source for the reported figures")
    p.add_argument("--val_fraction", type=float, default=0.05, help="share of --train held out when --val is not given")
    p.add_argument("--max_pairs", type=int, help="at most this many pairs per split (a seeded sample)")
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2",
                   help="frozen encoder for the embedding rows; 'none' skips them")
    p.add_argument("--precision", choices=["32", "bf16"], default="32", help="the frozen encoder's precision")
    p.add_argument("--tfidf_dim", type=int, default=64, help="FILM's d over TF-IDF")
    p.add_argument("--tfidf_rank", type=int, help="FILM's r over TF-IDF (default: the solver's, max(8d, 256))")
    p.add_argument("--encoder_dim", type=int, default=128, help="FILM's d over the frozen embeddings")
    p.add_argument("--encoder_rank", type=int, help="FILM's r over the frozen embeddings (default: the solver's)")
    p.add_argument("--minibatch", type=int, default=256, help="M-FILM: anchors per step")
    p.add_argument("--minibatch_step", type=float, default=0.5, help="M-FILM: initial normalised step")
    p.add_argument("--steps", type=int, default=300, help="M-FILM steps")
    p.add_argument("--margin", type=float, default=1.0)
    p.add_argument("--l2", type=float, default=1.0)
    p.add_argument("--n_per_anchor", type=int, default=5, help="triplets per anchor sentence")
    p.add_argument("--k_candidates", type=int, nargs="+", default=[1, 2, 3, 5, 10, 20, 50, 100])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--output", help="write the results as JSON here (never overwritten)")
    p.add_argument("--record", action="store_true",
                   help="write the run's record (results/benchmarks/film_pairs/), from which docs/FILM.md's table is made")
    args = p.parse_args(argv)
    if bool(args.sts_dir) == bool(args.train and args.test):
        p.error("give either --sts_dir or --train and --test")
    if args.output and os.path.exists(args.output):
        p.error(f"{args.output}: already exists; choose another --output")
    torch.set_num_threads(args.threads)
    step = Steps()

    with step("load pairs"):
        splits = load_splits(args)
    sentences, idx, y = {}, {}, {}
    for s in SPLITS:
        sentences[s], idx[s], y[s] = index_pairs(splits[s])
        print(f"{s}: {len(y[s])} pairs ({int(y[s].sum())} duplicates), {len(sentences[s])} distinct sentences")

    with step("TF-IDF fit (train sentences)"):
        X_train, vectorizer = tfidf_features(sentences["train"])  # (D, n_train)
    with step("triplets (components of the positive pairs)"):
        groups = groups_from_pairs(len(sentences["train"]), idx["train"][y["train"] == 1])
        triplets = triplets_from_groups(groups, args.n_per_anchor, args.seed)  # (m, 3)
    n_groups = int((torch.bincount(groups) >= 2).sum())
    print(f"{n_groups} groups of two or more sentences; {len(triplets)} triplets")

    sparse = {s: vectorizer.transform(sentences[s]) for s in ("val", "test")}  # (n, D) CSR, rows L2-normalised
    tfidf = {s: dense_columns_used(x) for s, x in sparse.items()}
    with step("M-FILM fit over TF-IDF"):
        film_tfidf = fit_film(X_train, triplets, args.tfidf_dim, args.tfidf_rank, args)
    film_tfidf_emb = {s: torch.as_tensor(film_tfidf.transform(x.T.tocsc())) for s, x in sparse.items()}  # (n, d)

    prior = float(y["train"].mean())
    majority, ks = int(prior >= 0.5), args.k_candidates
    constant = {s: (np.full(len(y[s]), majority), np.full(len(y[s]), prior)) for s in ("val", "test")}
    rows = [{"method": "majority class of train", "choice": "-",
             "val_log_loss": metrics(y["val"], *constant["val"])["log_loss"],
             **metrics(y["test"], *constant["test"]), "fit_s": 0.0}]
    # (step label, method, cosine or kNN, features, the steps it needs): evaluated last, once every fit is timed
    fit_tfidf, fit_triplets = "TF-IDF fit (train sentences)", "triplets (components of the positive pairs)"
    evaluations = [
        ("TF-IDF cosine, tuned threshold", "TF-IDF cosine, tuned threshold", "cosine", tfidf, [fit_tfidf]),
        ("TF-IDF kNN, no metric", "TF-IDF kNN, no metric", "knn", tfidf, [fit_tfidf]),
        ("M-FILM over TF-IDF, kNN", f"M-FILM over TF-IDF (d {args.tfidf_dim}), kNN", "knn", film_tfidf_emb,
         [fit_tfidf, fit_triplets, "M-FILM fit over TF-IDF"]),
    ]
    if args.model != "none":
        import encoders

        name = args.model.rstrip("/").split("/")[-1]
        encode, fit_enc = f"{name}: load and encode every split", f"M-FILM fit over {name}"
        with step(encode):
            encoder = encoders.load(args.model)
            frozen = {s: encoder.encode(sentences[s], batch_size=64, precision=args.precision).double() for s in SPLITS}
        with step(fit_enc):
            film_enc = fit_film(frozen["train"].T, triplets, args.encoder_dim, args.encoder_rank, args)
        film_enc_emb = {s: film_enc.transform(frozen[s].T) for s in ("val", "test")}  # (n, d)
        evaluations += [
            (f"{name} cosine", f"{name} cosine, tuned threshold", "cosine", frozen, [encode]),
            (f"{name} kNN", f"{name} kNN, no metric", "knn", frozen, [encode]),
            (f"M-FILM over {name}", f"M-FILM over {name} (d {args.encoder_dim}), kNN", "knn", film_enc_emb,
             [encode, fit_triplets, fit_enc]),
        ]
    for label, method, kind, emb, needs in evaluations:
        own = f"{label}: choose on validation, label test"
        with step(own):
            row = cosine_row(method, emb, idx, y) if kind == "cosine" else knn_row(method, emb, idx, y, ks)
        row["fit_s"] = sum(step.seconds[s] for s in needs) + step.seconds[own]
        rows.append(row)

    table = fmt_table(rows, step.seconds)
    print(table)
    result = {"machine": machine(args.threads), "args": vars(args), "rows": rows, "seconds": step.seconds,
              "pairs": {s: {"pairs": len(y[s]), "duplicates": int(y[s].sum())} for s in SPLITS},
              "groups": n_groups, "triplets": len(triplets), "table": table}
    if args.output:
        with open(args.output, "x") as f:
            json.dump(result, f, indent=2)
    if args.record:
        from harness.measurement import write_record

        figures = {f"{row['method']} {key}": round(float(row[key]), 4) for row in rows
                   for key in ("accuracy", "f1", "log_loss", "val_log_loss", "fit_s") if key in row}
        write_record("film_pairs", figures, args.threads, notes={
            "choices": {row["method"]: row["choice"] for row in rows}, "methods": [row["method"] for row in rows],
            "pairs": result["pairs"], "groups": n_groups, "triplets": len(triplets), "sources": {
                k: v for k, v in vars(args).items() if k in ("sts_dir", "train", "test", "model")}})
    return result


if __name__ == "__main__":
    main()
