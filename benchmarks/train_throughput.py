"""Optimizer steps/s: our MNR (Lightning) vs sentence-transformers' trainer, and ours against itself.

Same model (offline all-MiniLM-L6-v2, mean pooling), same pairs (the entailment pairs of
``DIR/nli/snli.test.tsv``), same batch size, max length, precision, AdamW (lr 2e-5, weight decay
0.01, 10% linear warmup), scale 20. ``--compare`` picks what is timed:

- ``peer``: ours as ``train.py`` runs it against theirs, in two settings. ``identical batches``:
  our sampler's no-duplicate batches (no length grouping), and theirs handed exactly those batches
  in that order (a ``batch_sampler`` callable, their documented hook). ``own batching``: ours with
  ``group_by_length``; theirs with its recommended sampler for this loss, ``NO_DUPLICATES``.
- ``allocator``: on identical batches, ours with glibc's malloc defaults against ours as shipped
  (``harness/allocator.py``: freed memory kept), and theirs as shipped against theirs with the
  same two ``mallopt`` calls: the tax is glibc's, not either codebase's.
- ``padding_free`` (the default): on identical batches, ours as shipped (padding-free: the encoder's
  token-wise layers run on real tokens only, ``encoders/unpadded.py``) and ours on the padded batch
  (``padding_free=False``), each against theirs and against each other; the share of real tokens in
  the timed batches is printed with them.
- ``compile``: on identical batches, ours eager against ours with ``model.encoder.compile``
  (widths bucketed to multiples of 16). The compiled program first compiles every shape training
  can meet (one forward and backward per width bucket, timed as its compile seconds), so its timed
  steps are steady-state ones; the table adds the steps after which compiling has paid for itself.
  ``peer`` has the compiled program too, against theirs and against ours eager.

Each repetition runs every program once, in turns (the order rotated), each in a FRESH PROCESS as a
user's run is (in one long process the order, not the code, decided the ratio: whichever ran
first paid the allocator's page faults). steps/s is taken over the last ``--steps`` steps from the
trainers' own step-end hooks, so start-up (model load, tokenization, data set-up) is excluded;
minor page faults and kernel seconds per step are reported over the same steps. Reported: the
median of the per-repetition ratios. The ``datasets`` cache is a temporary directory.

    python benchmarks/train_throughput.py --data_dir $SENTEMB_DATA [--compare padding_free|peer|allocator|compile]
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

from common import FixedBatches, machine, print_machine, run_child, set_threads, write_record

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


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


def run_ours(args, group_by_length: bool, callbacks: tuple = (), profiler=None, compile: bool = False,
             padding_free: bool | None = None) -> dict:
    import lightning as L
    import torch

    from encoders.sentence import SentenceEncoder
    from lightning_modules.mnr import MNR

    torch.manual_seed(args.seed)
    encoder = SentenceEncoder(MODEL, pooling="mean", max_seq_length=args.max_length, compile=compile,
                              padding_free=padding_free)
    model = MNR(encoder, scale=20.0, lr=2e-5, weight_decay=0.01, warmup_ratio=0.1)
    stamps: list[tuple[float, int, float]] = []
    tokens = [0, 0]  # real, computed-if-padded token positions of the timed batches
    compile_s = precompile(encoder, args) if compile else None

    class Stamp(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            stamps.append(stamp())
            if len(stamps) > args.warmup_steps:
                for mask in (v["attention_mask"] for v in batch.values() if isinstance(v, dict)):
                    tokens[0] += int(mask.sum())
                    tokens[1] += mask.numel()

    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=args.warmup_steps + args.steps,
        precision="bf16-mixed" if args.precision == "bf16" else "32-true", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[Stamp(), *callbacks], use_distributed_sampler=False,
        profiler=profiler,
    )
    trainer.fit(model, datamodule=ours_datamodule(args, encoder, group_by_length))
    return {**window(args, stamps), "real_token_share": tokens[0] / max(tokens[1], 1),
            **({"compile_s": compile_s} if compile else {})}


def precompile(encoder, args) -> float:
    """Compile every graph a training step of this benchmark can meet: one forward and backward per
    width bucket at the training batch size, with and without padding, under the training
    precision; the seconds it took."""
    import contextlib

    import torch
    from lightning.pytorch.plugins.precision import MixedPrecision

    start = time.perf_counter()
    bucket = encoder.pad_to_multiple_of
    encoder.train()
    for width in range(bucket, -(-args.max_length // bucket) * bucket + 1, bucket):
        ids = torch.full((args.batch_size, width), 1000, dtype=torch.long)
        for padded in (True, False):  # transformers drops an all-ones mask: another graph
            mask = torch.ones_like(ids)
            mask[0, -1] = 0 if padded else 1
            # Lightning's own autocast (its cache setting is part of what a compiled graph is guarded on)
            with (MixedPrecision("bf16-mixed", "cpu").autocast_context_manager() if args.precision == "bf16"
                  else contextlib.nullcontext()):
                out = encoder({"input_ids": ids, "attention_mask": mask})
            out.float().sum().backward()
    encoder.zero_grad(set_to_none=True)
    return time.perf_counter() - start


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


COMPARISONS = {  # --compare: (numerator, denominator) programs of each ratio row, "setting/program"
    "peer": [("identical batches/ours", "identical batches/theirs"), ("own batching/ours", "own batching/theirs"),
             ("identical batches/ours, compiled", "identical batches/theirs"),
             ("identical batches/ours, compiled", "identical batches/ours")],
    "allocator": [("identical batches/ours", "identical batches/ours, malloc defaults"),
                  ("identical batches/theirs, freed memory kept", "identical batches/theirs")],
    "compile": [("identical batches/ours, compiled", "identical batches/ours")],
    "padding_free": [("identical batches/ours", "identical batches/theirs"),
                     ("identical batches/ours, padded", "identical batches/theirs"),
                     ("identical batches/ours", "identical batches/ours, padded")],
}
PROGRAMS = sorted({p for rows in COMPARISONS.values() for row in rows for p in row})


def run_one(args, program: str) -> dict:
    """One program of one setting, in this process (the child's side of ``in_fresh_process``).

    Ours keeps freed memory as ``train.py`` does (``--keep_freed_memory``, on by default) unless the
    program says "malloc defaults"; theirs keeps glibc's defaults unless it says "freed memory kept".
    """
    from harness.allocator import keep_freed_memory

    setting, name = program.split("/")
    if (name.startswith("ours") and "malloc defaults" not in name) or "freed memory kept" in name:
        keep_freed_memory()
    if name.startswith("ours"):
        return run_ours(args, group_by_length=setting == "own batching", compile="compiled" in name,
                        padding_free=False if "padded" in name else None)
    if setting == "identical batches":
        pairs, batches = identical_batches(args)
        return run_theirs(args, batches, pairs)
    return run_theirs(args, None, identical_batches(args)[0])


def in_fresh_process(argv: list[str], program: str) -> dict[str, float]:
    """Run ``program`` in a new Python process with the same arguments; its result back."""
    return run_child([sys.executable, os.path.abspath(__file__), *argv, "--program", program], program)


def ratio_table(args, runs: dict[str, list[dict]], rows: list[tuple[str, str]]) -> dict:
    """One markdown row per (numerator, denominator): medians and the median per-repetition ratio."""
    print(f"\n| numerator / denominator | steps/s | ratio (median of {args.reps}) "
          "| minor faults/step | kernel s/step |")
    print("|---|---|---|---|---|")
    out = {}
    for num, den in rows:
        med = {p: {k: statistics.median(x[k] for x in runs[p]) for k in ("steps_per_s", "faults_per_step",
                                                                          "sys_s_per_step")} for p in (num, den)}
        ratio = statistics.median(a["steps_per_s"] / b["steps_per_s"] for a, b in zip(runs[num], runs[den]))
        out[f"{num} / {den}"] = {"ratio": round(ratio, 3), num: med[num], den: med[den]}
        print(f"| {num} / {den} | {med[num]['steps_per_s']:.3f} / {med[den]['steps_per_s']:.3f} | **{ratio:.2f}x** "
              f"| {med[num]['faults_per_step']:,.0f} / {med[den]['faults_per_step']:,.0f} "
              f"| {med[num]['sys_s_per_step']:.3f} / {med[den]['sys_s_per_step']:.3f} |")
    for num, den in rows:
        if "compile_s" in runs[num][0]:
            compile_s = statistics.median(x["compile_s"] for x in runs[num])
            saved = 1 / out[f"{num} / {den}"][den]["steps_per_s"] - 1 / out[f"{num} / {den}"][num]["steps_per_s"]
            pays = f"after {compile_s / saved:,.0f} steps" if saved > 0 else "never (no step is faster)"
            print(f"{num}: compiling took {compile_s:.0f} s (median); against {den} it pays for itself {pays}")
            out[f"{num} / {den}"].update(compile_s=round(compile_s, 1), pays_off=pays)
    return out


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
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="padding_free")
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
              f"{args.steps} timed steps after {args.warmup_steps}, each run in a fresh process; compare {args.compare}")
        rows = COMPARISONS[args.compare]
        programs = list(dict.fromkeys(p for row in rows for p in row))  # each program once a repetition
        runs: dict[str, list[dict]] = {p: [] for p in programs}
        for rep in range(args.reps):
            for program in programs if rep % 2 == 0 else programs[::-1]:
                runs[program].append(in_fresh_process(sys.argv[1:], program))
            print(f"rep {rep + 1}: " + "; ".join(f"{p} {runs[p][-1]['steps_per_s']:.3f}" for p in programs), flush=True)
        out = ratio_table(args, runs, rows)
        shares = {p: round(runs[p][0]["real_token_share"], 3) for p in programs if "real_token_share" in runs[p][0]}
        print("real tokens / padded token positions of the timed batches: "
              + "; ".join(f"{p} {v:.0%}" for p, v in shares.items()))
        figures = {f"{key} ratio": row["ratio"] for key, row in out.items()}
        figures.update({f"{p} steps/s": round(statistics.median(x["steps_per_s"] for x in runs[p]), 4) for p in programs})
        figures.update({f"{p} real token share": v for p, v in shares.items()})
        write_record(f"train_throughput_{args.compare}", figures, info["threads"], notes={
            "batch_size": args.batch_size, "max_length": args.max_length, "precision": args.precision,
            "steps": args.steps, "warmup_steps": args.warmup_steps, "reps": args.reps})
    finally:
        shutil.rmtree(args.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
