"""WikiDataModule on a 1M-line file: setup time and peak memory, then pipeline vs training speed.

1. Builds a 1M-line sentence file in a temporary directory by repeating the given Wikipedia
   sentences with numbered variations ("... (variant 17)"); ``--duplicate_every`` lines repeat an
   earlier line exactly, as real corpora do (wiki1m has ~3% duplicates), so the batch sampler's
   duplicate handling does real work.
2. ``WikiDataModule.setup("fit")`` twice, each in a fresh process so peak memory is its own
   (``ru_maxrss``): first with an empty ``datasets`` cache (read + tokenize + write Arrow), then
   from the cache. Each prints the time spent in each step of setup. The first also times a bare
   loop of fast-tokenizer calls (``tokenizer(batch, truncation=True, max_length=...)``, 2,000
   sentences a call, one process) over the same sentences, after setup: the ratio of setup's
   tokenize step (batched ``datasets.map`` writing Arrow, one process per core from 100k rows) to
   that loop, in sentences/s, is the first-run tokenization figure.
3. Sentences/s the train dataloader delivers vs sentences/s a training step consumes (the
   all-MiniLM-L6-v2 encoder forward + backward + AdamW step on batches of 64 at max length 32,
   SimCSE-style: each sentence encoded twice), measured in turns, median of ``--reps``.

The ``datasets`` cache is a temporary directory (HF_DATASETS_CACHE), removed at the end.

    python benchmarks/data_pipeline.py --wiki $SENTEMB_DATA/wiki/wiki_sentences.txt [--lines 1000000]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time

import common  # noqa: F401  (sets sys.path and the offline environment)
from common import alternate, machine, print_machine, run_child, set_threads

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def build_file(wiki: str, path: str, lines: int, duplicate_every: int) -> None:
    with open(wiki, encoding="utf-8") as f:
        base = [line.strip() for line in f if line.strip()]
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as out:
        for i in range(lines):
            if duplicate_every and i % duplicate_every == duplicate_every - 1:
                j = rng.randrange(i)  # an exact copy of a random earlier line
                variant, k = divmod(j, len(base))
            else:
                variant, k = divmod(i, len(base))
            out.write(base[k] if variant == 0 else f"{base[k]} (variant {variant})")
            out.write("\n")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def bare_tokenizer_seconds(tokenizer, sentences: list[str], max_length: int, batch: int = 2000) -> float:
    """Seconds a plain loop of batched fast-tokenizer calls takes over ``sentences`` (ids kept, as a user would)."""
    start = time.perf_counter()
    for i in range(0, len(sentences), batch):
        tokenizer(sentences[i:i + batch], truncation=True, max_length=max_length)["input_ids"]
    return time.perf_counter() - start


def setup_phase(path: str, batch_size: int, max_length: int, group_by_length: bool, bare: bool = False) -> dict:
    """One setup in this (fresh) process: seconds per step and peak memory."""
    import datamodules.base as base_module
    from datamodules import WikiDataModule
    from encoders.sentence import SentenceEncoder
    from lightning_modules.simcse import SimCSE

    encoder = SentenceEncoder(MODEL, max_seq_length=max_length)
    dm = WikiDataModule(train_source=path, per_device_batch_size=batch_size, group_by_length=group_by_length)
    dm.use_tokenizer(**encoder.tokenization())
    dm.check_objective(SimCSE)  # SimCSE's batches: no sentence twice
    steps: dict[str, float] = {}

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                steps[name] = steps.get(name, 0.0) + time.perf_counter() - start
        return wrapper

    dm.load_train_rows = timed("load_train_rows (read, check)", dm.load_train_rows)
    dm.unique_keys = timed("unique_keys", dm.unique_keys)
    dm.tokenize = timed("tokenize (map + Arrow cache)", dm.tokenize)
    sampler_cls = base_module.SentenceBatchSampler
    sampler_cls.global_batches = timed("sampler: build batches (dedup)", sampler_cls.global_batches)
    before = rss_mb()
    start = time.perf_counter()
    dm.setup("fit")
    total = time.perf_counter() - start
    tokenizer_rates = {}
    if bare:
        sentences = dm.train_dataset[dm.text_columns[0]]
        bare_s = bare_tokenizer_seconds(encoder.tokenizer, sentences, max_length)
        ours_s = steps["tokenize (map + Arrow cache)"]
        tokenizer_rates = {"bare_tokenizer_sentences_per_s": round(len(sentences) / bare_s),
                           "tokenize_sentences_per_s": round(len(sentences) / ours_s),
                           "tokenize_over_bare": round(bare_s / ours_s, 3)}
    return {"seconds": round(total, 2), "steps": {k: round(v, 2) for k, v in steps.items()}, **tokenizer_rates,
            "rows": len(dm.train_dataset), "batches": len(dm.train_sampler),
            "rss_before_setup_mb": round(before, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def run_phase(args, name: str) -> dict:
    cmd = [sys.executable, __file__, "--_phase", name, "--_file", args._file, "--batch_size", str(args.batch_size),
           "--max_length", str(args.max_length)] + (["--group_by_length"] if args.group_by_length else [])
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return run_child(cmd, f"setup phase {name}")


def speed(args) -> dict:
    """Dataloader sentences/s vs training sentences/s, in turns."""
    import torch

    from datamodules import WikiDataModule
    from encoders.sentence import SentenceEncoder
    from lightning_modules.simcse import SimCSE

    encoder = SentenceEncoder(MODEL, max_seq_length=args.max_length)
    dm = WikiDataModule(train_source=args._file, per_device_batch_size=args.batch_size,
                        group_by_length=args.group_by_length)
    dm.use_tokenizer(**encoder.tokenization())
    dm.check_objective(SimCSE)
    dm.setup("fit")  # from the cache written by the setup phases
    loader = iter(dm.train_dataloader())
    n_load = args.loader_batches

    def load():
        for _ in range(n_load):
            next(loader)

    batch = next(loader)["sentence"]  # real token ids, length as the pipeline pads them
    encoder.train()
    optimizer = torch.optim.AdamW([p for p in encoder.parameters() if p.requires_grad], lr=1e-5)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def train_steps():
        for _ in range(args.train_steps):
            with autocast:
                emb = encoder({k: torch.cat([v, v]) for k, v in batch.items()})  # (2B, H): two dropout views
                loss = emb.float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    load()
    train_steps()  # warm-up
    t = alternate({"dataloader": load, "training": train_steps}, args.reps)
    per_s_load = statistics.median(n_load * args.batch_size / s for s in t.wall["dataloader"])
    per_s_train = statistics.median(args.train_steps * args.batch_size / s for s in t.wall["training"])
    # per repetition: (sentences/s of the dataloader) / (sentences/s of training)
    ratio = statistics.median((n_load / tl) / (args.train_steps / tt)
                              for tl, tt in zip(t.wall["dataloader"], t.wall["training"]))
    return {"dataloader_sentences_per_s": round(per_s_load), "training_sentences_per_s": round(per_s_train, 1),
            "pipeline_over_training": round(ratio, 1), "batch_width": int(batch["input_ids"].shape[1]),
            "precision": args.precision}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wiki", help="sentences, one per line (e.g. $SENTEMB_DATA/wiki/wiki_sentences.txt)")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--duplicate_every", type=int, default=33, help="every Nth line repeats an earlier one (0: none)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--max_length", type=int, default=32)
    parser.add_argument("--group_by_length", action="store_true")
    parser.add_argument("--precision", choices=["bf16", "32"], default="bf16", help="of the training steps")
    parser.add_argument("--loader_batches", type=int, default=200)
    parser.add_argument("--train_steps", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--_phase", help=argparse.SUPPRESS)
    parser.add_argument("--_file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._phase:  # a child process: one setup
        set_threads(args.threads)
        print(json.dumps(setup_phase(args._file, args.batch_size, args.max_length, args.group_by_length,
                                     bare=args._phase.startswith("first"))))
        return
    if not args.wiki:
        parser.error("--wiki is required")

    info = machine(set_threads(args.threads))
    print_machine(info)
    tmp = tempfile.mkdtemp(prefix="data-pipeline-")
    os.environ["HF_DATASETS_CACHE"] = os.path.join(tmp, "hf-datasets-cache")  # never ~/.cache
    try:
        args._file = os.path.join(tmp, "sentences.txt")
        start = time.perf_counter()
        build_file(args.wiki, args._file, args.lines, args.duplicate_every)
        print(f"built {args.lines:,} lines ({os.path.getsize(args._file) / 2**20:.0f} MiB) in "
              f"{time.perf_counter() - start:.1f}s")
        phases = {name: run_phase(args, name) for name in ("first (empty cache)", "second (from cache)")}
        print("\n| setup | seconds | peak RSS MiB | " + " | ".join(phases["first (empty cache)"]["steps"]) + " |")
        print("|---|---|---|" + "---|" * len(phases["first (empty cache)"]["steps"]))
        for name, res in phases.items():
            print(f"| {name} | {res['seconds']:.1f} | {res['peak_rss_mb']:.0f} | "
                  + " | ".join(f"{v:.1f}" for v in res["steps"].values()) + " |")
        print(f"(RSS after imports and model load, before setup: {phases['second (from cache)']['rss_before_setup_mb']:.0f} MiB)")
        first = phases["first (empty cache)"]
        print(f"first-run tokenization: {first['tokenize_sentences_per_s']:,} sentences/s vs a bare tokenizer(batch) "
              f"loop's {first['bare_tokenizer_sentences_per_s']:,} in the same process: "
              f"**{first['tokenize_over_bare']:.2f}x**")
        result = speed(args)
        print(f"\n| | sentences/s (median of {args.reps}) |\n|---|---|")
        print(f"| train dataloader (batch {args.batch_size}) | {result['dataloader_sentences_per_s']:,} |")
        print(f"| training step ({result['precision']}, batch {args.batch_size} x 2 views, width "
              f"{result['batch_width']}) | {result['training_sentences_per_s']:,} |")
        print(f"pipeline delivers {result['pipeline_over_training']}x what training consumes")
        print(json.dumps({"benchmark": "data_pipeline", "machine": info, "lines": args.lines, "setup": phases,
                          **result}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
