"""Optimizer steps/s: our MNR (Lightning) vs sentence-transformers' trainer with MultipleNegativesRankingLoss.

Same model (offline all-MiniLM-L6-v2, mean pooling), same pairs (the entailment pairs of
``DIR/nli/snli.test.tsv``), same batch size, max length, precision, AdamW (lr 2e-5, weight decay
0.01, 10% linear warmup), scale 20, one process. Two settings:

- ``identical batches``: our sampler's no-duplicate batches (no length grouping), and theirs
  handed exactly those batches in that order (a ``batch_sampler`` callable, their documented hook);
- ``own batching``: ours with ``group_by_length`` (length-grouped, no duplicates); theirs with
  its recommended sampler for this loss, ``NO_DUPLICATES`` (it has no length grouping).

Each repetition trains a fresh copy of each for ``--warmup_steps + --steps`` steps, in turns (the
order rotated), each in a FRESH PROCESS as a user's run is: in one long process whichever program
ran first paid ~0.3 s a step of kernel time in page faults (glibc malloc returning and re-faulting
the large autograd buffers, ~45k minor faults a step against ~23k once the heap had grown), which
made the order, not the code, decide the ratio. steps/s is taken over the last ``--steps`` steps
from the trainers' own step-end hooks, so start-up (model load, tokenization, data set-up) is
excluded; minor page faults and kernel seconds per step are reported over the same steps.
Reported: the median of the per-repetition ratio ours/theirs. The ``datasets`` cache is a
temporary directory.

    python benchmarks/train_throughput.py --data_dir /work/shared/data [--precision bf16] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

from common import machine, print_machine, run_child, set_threads

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


class FixedBatches:
    """A batch sampler that yields precomputed batches of indices (theirs, identical batches)."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:  # the trainer calls it each epoch
        pass


def stamp() -> tuple[float, int, float]:
    """(wall seconds, minor page faults, kernel CPU seconds) of this process now."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), usage.ru_minflt, usage.ru_stime


def window(args, stamps: list[tuple[float, int, float]]) -> dict[str, float]:
    """steps/s, minor faults and kernel seconds per step over the timed steps (after warm-up)."""
    (t0, f0, s0), (t1, f1, s1) = stamps[args.warmup_steps - 1], stamps[-1]
    return {"steps_per_s": args.steps / (t1 - t0), "faults_per_step": (f1 - f0) / args.steps,
            "sys_s_per_step": (s1 - s0) / args.steps}


def ours_datamodule(args, encoder, group_by_length: bool):
    from datamodules import NLIDataModule

    dm = NLIDataModule(train_sources=[os.path.join(args.data_dir, "nli", "snli.test.tsv")], view="pairs",
                       per_device_batch_size=args.batch_size, group_by_length=group_by_length, seed=args.seed)
    dm.use_tokenizer(**encoder.tokenization())
    return dm


def run_ours(args, group_by_length: bool, callbacks: tuple = (), profiler=None) -> dict[str, float]:
    import lightning as L
    import torch

    from encoders.sentence import SentenceEncoder
    from lightning_modules.mnr import MNR

    torch.manual_seed(args.seed)
    encoder = SentenceEncoder(MODEL, pooling="mean", max_seq_length=args.max_length)
    model = MNR(encoder, scale=20.0, lr=2e-5, weight_decay=0.01, warmup_ratio=0.1)
    stamps: list[tuple[float, int, float]] = []

    class Stamp(L.Callback):
        def on_train_batch_end(self, *_):
            stamps.append(stamp())

    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=args.warmup_steps + args.steps,
        precision="bf16-mixed" if args.precision == "bf16" else "32-true", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[Stamp(), *callbacks], use_distributed_sampler=False,
        profiler=profiler,
    )
    trainer.fit(model, datamodule=ours_datamodule(args, encoder, group_by_length))
    return window(args, stamps)


def run_theirs(args, batches: list[list[int]] | None, pairs, callbacks: tuple = ()) -> dict[str, float]:
    import torch
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    from encoders.hub import resolve_model_name

    torch.manual_seed(args.seed)
    model = SentenceTransformer(resolve_model_name(MODEL), device="cpu")
    model.max_seq_length = args.max_length
    stamps: list[tuple[float, int, float]] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, *_, **__):
            stamps.append(stamp())

    sampler = BatchSamplers.NO_DUPLICATES if batches is None else (lambda *a, **k: FixedBatches(batches))
    targs = SentenceTransformerTrainingArguments(
        output_dir=os.path.join(args.tmp, "st-out"), max_steps=args.warmup_steps + args.steps,
        per_device_train_batch_size=args.batch_size, learning_rate=2e-5, weight_decay=0.01, warmup_ratio=0.1,
        lr_scheduler_type="linear", bf16=args.precision == "bf16", use_cpu=True, batch_sampler=sampler,
        dataloader_drop_last=True, save_strategy="no", report_to="none", logging_strategy="no",
        disable_tqdm=True, seed=args.seed, dataloader_num_workers=0,
    )
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=pairs,
                                         loss=MultipleNegativesRankingLoss(model, scale=20.0),
                                         callbacks=[Stamp(), *callbacks])
    trainer.train()
    return window(args, stamps)


def identical_batches(args) -> tuple:
    """Our no-duplicate batches (indices), and the same rows as a plain pair dataset for theirs."""
    from encoders.sentence import SentenceEncoder

    dm = ours_datamodule(args, SentenceEncoder(MODEL, max_seq_length=args.max_length), group_by_length=False)
    dm.setup("fit")
    pairs = dm.train_dataset.select_columns(["anchor", "positive"])
    return pairs, dm.train_sampler.global_batches()[: args.warmup_steps + args.steps]


PROGRAMS = ("identical batches/ours", "identical batches/theirs", "own batching/ours", "own batching/theirs")


def run_one(args, program: str) -> dict[str, float]:
    """One program of one setting, in this process (the child's side of ``in_fresh_process``)."""
    setting, name = program.split("/")
    if name == "ours":
        return run_ours(args, group_by_length=setting == "own batching")
    if setting == "identical batches":
        pairs, batches = identical_batches(args)
        return run_theirs(args, batches, pairs)
    return run_theirs(args, None, identical_batches(args)[0])


def in_fresh_process(argv: list[str], program: str) -> dict[str, float]:
    """Run ``program`` in a new Python process with the same arguments; its result back."""
    return run_child([sys.executable, os.path.abspath(__file__), *argv, "--program", program], program)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", required=True, help="holds nli/snli.test.tsv")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--precision", choices=["bf16", "32"], default="bf16")
    parser.add_argument("--steps", type=int, default=12, help="timed steps per run")
    parser.add_argument("--warmup_steps", type=int, default=3, help="untimed steps first")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--program", choices=PROGRAMS, help=argparse.SUPPRESS)  # a child's one program
    args = parser.parse_args()

    info = machine(set_threads(args.threads))
    args.tmp = tempfile.mkdtemp(prefix="train-throughput-")
    os.environ["HF_DATASETS_CACHE"] = os.path.join(args.tmp, "hf-datasets-cache")  # never ~/.cache
    import logging

    import transformers

    transformers.logging.set_verbosity_error()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    try:
        if args.program:
            print(json.dumps(run_one(args, args.program)))
            return
        print_machine(info)
        print(f"batch {args.batch_size}, max length {args.max_length}, precision {args.precision}, "
              f"{args.steps} timed steps after {args.warmup_steps}, each run in a fresh process")
        settings = ["identical batches", "own batching"]
        runs = {s: {"ours": [], "theirs": []} for s in settings}
        for rep in range(args.reps):
            for setting in settings:
                for name in (["ours", "theirs"] if rep % 2 == 0 else ["theirs", "ours"]):
                    runs[setting][name].append(in_fresh_process(sys.argv[1:], f"{setting}/{name}"))
            print(f"rep {rep + 1}: " + "; ".join(
                f"{s}: ours {r['ours'][-1]['steps_per_s']:.2f}, theirs {r['theirs'][-1]['steps_per_s']:.2f} steps/s"
                for s, r in runs.items()), flush=True)

        print(f"\n| setting | ours steps/s | theirs steps/s | ours/theirs (median of {args.reps}) "
              "| minor faults/step ours, theirs | kernel s/step ours, theirs |")
        print("|---|---|---|---|---|---|")
        out = {}
        for setting, r in runs.items():
            med = {name: {k: statistics.median(x[k] for x in r[name]) for k in r[name][0]} for name in r}
            ratio = statistics.median(a["steps_per_s"] / b["steps_per_s"] for a, b in zip(r["ours"], r["theirs"]))
            out[setting] = {"ours": {k: round(v, 3) for k, v in med["ours"].items()},
                            "theirs": {k: round(v, 3) for k, v in med["theirs"].items()}, "ratio": round(ratio, 3)}
            print(f"| {setting} | {med['ours']['steps_per_s']:.2f} | {med['theirs']['steps_per_s']:.2f} "
                  f"| {ratio:.2f}x | {med['ours']['faults_per_step']:,.0f}, {med['theirs']['faults_per_step']:,.0f} "
                  f"| {med['ours']['sys_s_per_step']:.2f}, {med['theirs']['sys_s_per_step']:.2f} |")
        print(json.dumps({"benchmark": "train_throughput", "machine": info, "batch_size": args.batch_size,
                          "max_length": args.max_length, "precision": args.precision, "steps": args.steps,
                          "reps": args.reps, "results": out}))
    finally:
        shutil.rmtree(args.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
