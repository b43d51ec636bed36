"""Does sentence-transformers, given the same rows, budget and seed, end where our objective ends? Train its peer.

The rows come from our own data modules (``load_train_rows``), so both codebases see exactly the
same training examples; the start model (offline all-MiniLM-L6-v2), batch size, optimizer steps,
learning rate, warmup, weight decay, max length, precision and seed are the command-line values,
which the results script sets equal to our run's. Their trainer uses its own sampler (random, or
``NO_DUPLICATES`` for MNR, its recommendation), so the batches differ; the budget does not.
``--batches ours`` hands their trainer our sampler's batches instead (length-grouped when
``--group_by_length``, in the order of our data seed ``--data_seed``), so the two trainers differ in
nothing but the step and its random draws.

    python experiments/st_peer_train.py --objective cosine --data_dir $SENTEMB_DATA --output DIR

Objectives and their sentence-transformers loss:
  softmax  SoftmaxLoss over [u; v; |u-v|], 3 labels     (NLI: snli.test + mnli.dev_matched)
  cosine   CosineSimilarityLoss (MSE of cos, score/5)   (sts/stsb.train.tsv)
  triplet  TripletLoss, Euclidean, margin 1 (SBERT's)   (NLI triplets)
  mnr      MultipleNegativesRankingLoss, scale 20       (NLI entailment pairs)

The peer trains the same network as ours: transformer + mean pooling. The start model's
sentence-transformers pipeline ends with a ``Normalize`` module that our encoder does not have,
so it is dropped unless ``--keep_normalize``: cosine-based losses (regression, MNR) do not see
the difference, but the triplet loss's Euclidean margin and softmax's [u; v; |u-v|] do (unit
vectors against mean-pooled vectors of norm ~5 for this model).

Writes the trained model to ``--output`` (a sentence-transformers directory that ``evaluate.py
--model`` scores) and prints one JSON line with the wall time of ``trainer.train()``.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from harness.measurement import FixedBatches, set_threads

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
NLI_FILES = ("nli/snli.test.tsv", "nli/mnli.dev_matched.tsv")


def training_rows(objective: str, data_dir: str):
    """Our data modules' validated rows, with the column names sentence-transformers expects."""
    from datamodules import NLIDataModule, STSDataModule

    if objective == "cosine":
        rows = STSDataModule(train_source=os.path.join(data_dir, "sts", "stsb.train.tsv")).load_train_rows()
        return rows  # sentence1, sentence2, score in [0, 1]
    view = {"softmax": "labelled", "triplet": "triplets", "mnr": "pairs"}[objective]
    dm = NLIDataModule(train_sources=[os.path.join(data_dir, f) for f in NLI_FILES], view=view)
    return dm.load_train_rows()


def our_batches(objective: str, data_dir: str, args):
    """The rows as our data module indexes them, and our sampler's first ``args.steps`` batches."""
    from datamodules import NLIDataModule, STSDataModule
    from encoders.sentence import SentenceEncoder

    common = {"per_device_batch_size": args.batch_size, "group_by_length": args.group_by_length,
              "seed": args.data_seed}
    if objective == "cosine":
        dm = STSDataModule(train_source=os.path.join(data_dir, "sts", "stsb.train.tsv"), **common)
    else:
        view = {"softmax": "labelled", "triplet": "triplets", "mnr": "pairs"}[objective]
        dm = NLIDataModule(train_sources=[os.path.join(data_dir, f) for f in NLI_FILES], view=view, **common)
    dm.use_tokenizer(**SentenceEncoder(MODEL, max_seq_length=args.max_length).tokenization())
    dm.setup("fit")
    batches = dm.train_sampler.global_batches()
    if len(batches) < args.steps:
        raise SystemExit(f"--batches ours: {len(batches)} batches in an epoch, fewer than --steps {args.steps}")
    return dm.train_dataset.select_columns(list(dm.batch_keys)), batches[: args.steps]


def build_loss(objective: str, model):
    from sentence_transformers.sentence_transformer import losses

    if objective == "softmax":
        return losses.SoftmaxLoss(model, model.get_sentence_embedding_dimension(), num_labels=3)
    if objective == "cosine":
        return losses.CosineSimilarityLoss(model)
    if objective == "triplet":
        return losses.TripletLoss(model, distance_metric=losses.TripletDistanceMetric.EUCLIDEAN, triplet_margin=1.0)
    return losses.MultipleNegativesRankingLoss(model, scale=20.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objective", required=True, choices=["softmax", "cosine", "triplet", "mnr"])
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--output", required=True, help="a new directory for the trained model")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--warmup_ratio", type=float, default=0.1)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--precision", choices=["bf16", "32"], default="bf16")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batches", choices=["theirs", "ours"], default="theirs",
                        help="ours: their trainer takes our sampler's batches (one epoch's first --steps)")
    parser.add_argument("--group_by_length", action=argparse.BooleanOptionalAction, default=True,
                        help="with --batches ours: our length-grouped batches (our configs' setting)")
    parser.add_argument("--max_grad_norm", type=float, default=1.0,
                        help="their trainer's gradient clipping (its default 1.0; 0 turns it off)")
    parser.add_argument("--data_seed", type=int, default=42, help="with --batches ours: our batch order's seed")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--keep_normalize", action="store_true",
                        help="train the start model's pipeline as is, Normalize module included")
    args = parser.parse_args()
    if os.path.exists(args.output) and os.listdir(args.output):
        parser.error(f"--output {args.output} exists and is not empty (earlier results are never overwritten)")
    set_threads(args.threads)

    import torch
    import transformers
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.base.sampler import BatchSamplers

    from encoders.hub import resolve_model_name

    transformers.logging.set_verbosity_error()
    if args.batches == "ours":
        rows, batches = our_batches(args.objective, args.data_dir, args)
    else:
        rows, batches = training_rows(args.objective, args.data_dir), None
    torch.manual_seed(args.seed)
    model = SentenceTransformer(resolve_model_name(MODEL), device="cpu")
    model.max_seq_length = args.max_length
    if not args.keep_normalize and type(model[len(model) - 1]).__name__ == "Normalize":
        del model[len(model) - 1]  # ours has no Normalize: train the same network
    with tempfile.TemporaryDirectory(prefix="st-peer-") as tmp:
        targs = SentenceTransformerTrainingArguments(
            output_dir=tmp, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
            learning_rate=args.lr, weight_decay=args.weight_decay, warmup_ratio=args.warmup_ratio,
            lr_scheduler_type="linear", bf16=args.precision == "bf16", use_cpu=True, max_grad_norm=args.max_grad_norm,
            batch_sampler=(BatchSamplers.NO_DUPLICATES if args.objective == "mnr" else BatchSamplers.BATCH_SAMPLER)
            if batches is None else (lambda *a, **k: FixedBatches(batches)),
            dataloader_drop_last=args.objective == "mnr", save_strategy="no", report_to="none",
            logging_strategy="no", disable_tqdm=True, seed=args.seed, dataloader_num_workers=0)
        trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=rows,
                                             loss=build_loss(args.objective, model))
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
    model.save(args.output)
    print(json.dumps({"peer": "sentence-transformers", "objective": args.objective, "steps": args.steps,
                      "batch_size": args.batch_size, "precision": args.precision, "seed": args.seed,
                      "batches": "theirs" if batches is None else
                      f"ours (group_by_length={args.group_by_length}, data seed {args.data_seed})",
                      "rows": len(rows), "train_wall_s": round(wall, 1), "output": args.output}))


if __name__ == "__main__":
    main()
