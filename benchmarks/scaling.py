"""How does the cost of training grow with the work? One table: step time and peak memory against the sequence
length, the batch size and the number of processes, and the first tokenization of a million sentences.

Every point is unsupervised SimCSE's step (the offline all-MiniLM-L6-v2, mean pooling, padding-free as shipped,
two dropout views of each sentence, fp32 unless ``--precision bf16``) run by Lightning as ``train.py`` runs it,
in a fresh process (its peak resident memory is that process's), timed over ``--steps`` steps after
``--warmup_steps``:

- **length**: sentences of exactly 32, 64, 128 and 256 tokens (consecutive lines of the wiki file joined, then
  truncated), batch 32;
- **batch**: 64 to 1024 sentences of the wiki file at max length 32, with GradCache (``mini_batch_size`` of
  ``GRAD_CACHE_MINI_BATCH``: the same gradients in the memory of that many) from ``--grad_cache_from`` up;
- **processes**: batch 64 a process, 1 and 2 processes (CPU DDP over gloo, one thread each, in-batch negatives
  gathered across them), and the scaling efficiency: sentences/s of 2 over twice those of 1;
- **tokenization**: the first tokenization of 1,000,000 lines (the wiki file repeated) by the data module, into
  an empty ``datasets`` cache: seconds and peak memory.

    python benchmarks/scaling.py --wiki $SENTEMB_DATA/wiki/wiki_sentences.txt [--parts length,batch,processes,tokens]

Writes its record (``results/benchmarks/scaling/``); docs/PERFORMANCE.md's table is generated from it.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

from common import machine, print_machine, run_child, set_threads, write_record  # noqa: I001 (sets sys.path)

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
LENGTHS = (32, 64, 128, 256)
BATCHES = (64, 128, 256, 512, 1024)
GRAD_CACHE_MINI_BATCH = 64  # sentences a GradCache pass holds, from --grad_cache_from up


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def long_lines(wiki: str, tokens: int, n: int, path: str) -> None:
    """``n`` lines of at least ``tokens`` tokens: consecutive wiki lines joined (the encoder truncates them)."""
    from transformers import AutoTokenizer

    from encoders.hub import resolve_model_name

    tok = AutoTokenizer.from_pretrained(resolve_model_name(MODEL))
    source = [line.strip() for line in open(wiki, encoding="utf-8") if line.strip()]
    out, i = [], 0
    while len(out) < n:
        parts, count = [], 0
        while count < tokens:
            parts.append(source[i % len(source)])
            count += len(tok.tokenize(source[i % len(source)]))
            i += 1
        out.append(" ".join(parts))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def train_point(args, source: str, max_length: int, batch: int, devices: int, mini_batch: int | None) -> dict:
    """One point, in this (fresh) process: seconds per step over the timed steps, on rank 0."""
    import lightning as L
    import torch

    from datamodules import WikiDataModule
    from encoders.sentence import SentenceEncoder
    from harness.allocator import keep_freed_memory
    from lightning_modules.simcse import SimCSE

    keep_freed_memory()
    torch.manual_seed(0)
    encoder = SentenceEncoder(MODEL, pooling="mean", max_seq_length=max_length)
    model = SimCSE(encoder=encoder, lr=3e-5, mini_batch_size=mini_batch,
                   gather_across_devices=devices > 1)
    dm = WikiDataModule(train_source=source, per_device_batch_size=batch, seed=0)
    dm.use_tokenizer(**encoder.tokenization())
    stamps: list[float] = []

    class Stamp(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch_, batch_idx):
            stamps.append(time.perf_counter())

    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                        max_steps=args.warmup_steps + args.steps,
                        precision="bf16-mixed" if args.precision == "bf16" else "32-true", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[Stamp()],
                        use_distributed_sampler=False)
    trainer.fit(model, datamodule=dm)
    if trainer.global_rank != 0:
        sys.exit(0)
    step_s = (stamps[-1] - stamps[args.warmup_steps - 1]) / args.steps
    return {"step_s": step_s, "sentences_per_s": batch * devices / step_s, "peak_mib": peak_mib()}


def tokens_point(args) -> dict:
    from datamodules import WikiDataModule
    from encoders.sentence import SentenceEncoder

    source = [line for line in open(args.wiki, encoding="utf-8") if line.strip()]
    path = os.path.join(args.tmp, "million.txt")
    with open(path, "w", encoding="utf-8") as f:
        for i in range(args.lines):
            f.write(source[i % len(source)])
    encoder = SentenceEncoder(MODEL, max_seq_length=32)
    dm = WikiDataModule(train_source=path, per_device_batch_size=64)
    dm.use_tokenizer(**encoder.tokenization())
    start = time.perf_counter()
    dm.setup("fit")
    return {"seconds": time.perf_counter() - start, "lines": len(dm.train_dataset), "peak_mib": peak_mib()}


def child(args) -> dict:
    point = json.loads(args.point)
    os.environ["HF_DATASETS_CACHE"] = os.path.join(args.tmp, "hf-cache-" + str(os.getpid()))
    if point["kind"] == "tokens":
        return tokens_point(args)
    return train_point(args, point["source"], point["max_length"], point["batch"], point["devices"],
                       point.get("mini_batch"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wiki", required=True, help="the wiki sentences (the data root's wiki/wiki_sentences.txt)")
    parser.add_argument("--parts", default="length,batch,processes,tokens")
    parser.add_argument("--precision", choices=["32", "bf16"], default="32")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each process")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup_steps", type=int, default=1)
    parser.add_argument("--grad_cache_from", type=int, default=512, help="GradCache from this batch size up")
    parser.add_argument("--lines", type=int, default=1_000_000, help="lines of the tokenization point")
    parser.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--point", default=None, help=argparse.SUPPRESS)  # a child's one point
    args = parser.parse_args()
    threads = set_threads(args.threads)
    if args.point:
        print(json.dumps(child(args)))
        return
    info = machine(threads)
    print_machine(info)
    args.tmp = tempfile.mkdtemp(prefix="scaling-")
    env_threads = {"OMP_NUM_THREADS": str(args.threads)}
    os.environ.update(env_threads)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    figures: dict[str, float] = {}

    def run(name: str, point: dict) -> dict | None:
        try:
            found = run_child([sys.executable, os.path.abspath(__file__), "--wiki", args.wiki, "--precision",
                               args.precision, "--threads", str(args.threads), "--steps", str(args.steps),
                               "--warmup_steps", str(args.warmup_steps), "--lines", str(args.lines), "--tmp",
                               args.tmp, "--point", json.dumps(point)], name)
        except SystemExit as err:  # a point that cannot run (killed for memory, say) is a finding, not the end
            figures[f"{name} failed"] = str(err).splitlines()[0]
            print(f"{name}: {figures[f'{name} failed']}", flush=True)
            return None
        print(f"{name}: {json.dumps({k: round(v, 3) for k, v in found.items()})}", flush=True)
        for key, value in found.items():
            figures[f"{name} {key}"] = round(value, 3)
        return found

    try:
        if "length" in parts:
            for length in LENGTHS:
                path = os.path.join(args.tmp, f"lines{length}.txt")
                long_lines(args.wiki, length, 32 * (args.warmup_steps + args.steps) + 64, path)
                run(f"length {length}", {"kind": "train", "source": path, "max_length": length, "batch": 32,
                                         "devices": 1})
        if "batch" in parts:
            for batch in BATCHES:
                mini = GRAD_CACHE_MINI_BATCH if batch >= args.grad_cache_from else None
                run(f"batch {batch}", {"kind": "train", "source": args.wiki, "max_length": 32, "batch": batch,
                                       "devices": 1, "mini_batch": mini})
        if "processes" in parts:
            one = run("processes 1", {"kind": "train", "source": args.wiki, "max_length": 32, "batch": 64,
                                      "devices": 1})
            two = run("processes 2", {"kind": "train", "source": args.wiki, "max_length": 32, "batch": 64,
                                      "devices": 2})
            if one and two:
                figures["processes efficiency"] = round(two["sentences_per_s"] / (2 * one["sentences_per_s"]), 3)
                print(f"DDP scaling efficiency, 2 processes: {figures['processes efficiency']:.2f}")
        if "tokens" in parts:
            run("tokenization", {"kind": "tokens"})
        write_record("scaling", figures, threads, notes={"precision": args.precision, "steps": args.steps,
                                                         "warmup_steps": args.warmup_steps, "lines": args.lines,
                                                         "grad_cache_from": args.grad_cache_from,
                                                         "grad_cache_mini_batch": GRAD_CACHE_MINI_BATCH})
    finally:
        shutil.rmtree(args.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
