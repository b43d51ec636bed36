"""Encoding and training sentences/s on a GPU in bf16, against the SBERT paper's 2,042 sentences/s.

The one script to run on a GPU machine (it also runs on CPU, slowly, as a dry run). Two
encoders: a BERT-base-sized one (12 layers, 768 hidden, built from ``BertConfig()`` with random
weights: throughput needs no pretrained weights; all-MiniLM-L6-v2's BERT uncased tokenizer) and
the offline all-MiniLM-L6-v2.

- **Encoding**: ``SentenceEncoder.encode`` over the STS-B test sentences (2,758; token-count
  sorted batches, our smart batching), fp32 and bf16 autocast, median of ``--reps``; for
  all-MiniLM-L6-v2 also ``SentenceTransformer.encode`` (fp32) on the same sentences. Reimers &
  Gurevych (2019, table 7) report 2,042 sentences/s for SBERT (BERT-base) with smart batching
  on a V100 in fp32; the BERT-base rows are the comparable ones.
- **Training**: our MNR objective on NLI entailment pairs (batch ``--batch_size`` per device,
  length-grouped, max length 128) under the Lightning Trainer with ``bf16-mixed``, on
  ``--devices`` GPUs with DDP and the in-batch candidates gathered across devices
  (``gather_across_devices``). Each model trains in its own process, as DDP re-launches the
  script per rank; sentences/s = steps x batch x 2 columns x devices / seconds over the steps
  after ``--warmup_steps``.

    python benchmarks/gpu_throughput.py --sts_dir $SENTEMB_DATA/sts --nli $SENTEMB_DATA/nli/snli.test.tsv
    # dry run on CPU: add --accelerator cpu --devices 1 --reps 1 --steps 2 --warmup_steps 1 --limit 256
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from common import machine, print_machine, run_child

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MODELS = ("bert-base", "all-MiniLM-L6-v2")
SBERT_V100 = 2042.0  # sentences/s, SBERT (BERT-base) with smart batching, V100 (Reimers & Gurevych 2019)


def build_encoder(name: str, max_seq_length: int = 128, compile: bool = False):
    from encoders.sentence import SentenceEncoder

    if name == "all-MiniLM-L6-v2":
        return SentenceEncoder(MINILM, pooling="mean", max_seq_length=max_seq_length, compile=compile)
    import tempfile

    from transformers import BertConfig, BertModel

    # BERT-base with random weights, saved with the MiniLM tokenizer so the encoder builds (and
    # compiles) it as it would any local model directory
    path = tempfile.mkdtemp(prefix="bert-base-random-")
    BertModel(BertConfig(), add_pooling_layer=False).save_pretrained(path)
    SentenceEncoder(MINILM, pretrained=False).tokenizer.save_pretrained(path)
    return SentenceEncoder(path, pooling="mean", max_seq_length=max_seq_length, compile=compile)


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def encode_rates(args, sentences: list[str]) -> dict[str, float]:
    """sentences/s of each encoding program, median over ``--reps`` after one warm-up pass."""
    device = "cuda" if args.accelerator == "gpu" else "cpu"
    programs = {}
    for name in MODELS:
        encoder = build_encoder(name).to(device).eval()
        for precision in ("32", "bf16"):
            programs[f"ours {name} {'fp32' if precision == '32' else 'bf16'}"] = (
                lambda e=encoder, p=precision: e.encode(sentences, batch_size=args.encode_batch_size, precision=p))
    from sentence_transformers import SentenceTransformer

    from encoders.hub import resolve_model_name

    theirs = SentenceTransformer(resolve_model_name(MINILM), device=device)
    programs["sentence-transformers all-MiniLM-L6-v2 fp32"] = lambda: theirs.encode(
        sentences, batch_size=args.encode_batch_size, convert_to_tensor=True)
    rates: dict[str, list[float]] = {k: [] for k in programs}
    for fn in programs.values():
        fn()  # warm-up: kernels, allocator
    for _ in range(args.reps):
        for name, fn in programs.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            rates[name].append(len(sentences) / (time.perf_counter() - start))
    return {k: statistics.median(v) for k, v in rates.items()}


def train_rate(args, name: str) -> None:
    """One model's MNR training under DDP; rank 0 prints the result as a JSON line (run in a child process)."""
    import lightning as L

    from datamodules import NLIDataModule
    from lightning_modules.mnr import MNR

    L.seed_everything(args.seed)
    encoder = build_encoder(name, compile=args.compile)
    model = MNR(encoder, scale=20.0, gather_across_devices=True, lr=2e-5)
    dm = NLIDataModule(train_sources=[args.nli], view="pairs", per_device_batch_size=args.batch_size,
                       group_by_length=True, seed=args.seed)
    dm.use_tokenizer(**encoder.tokenization())
    stamps: list[float] = []

    class Stamp(L.Callback):
        def on_train_batch_end(self, trainer, *_):
            if args.accelerator == "gpu":
                sync("cuda")
            stamps.append(time.perf_counter())

    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices,
                        strategy="ddp" if args.devices > 1 else "auto", precision=args.precision,
                        max_steps=args.warmup_steps + args.steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, callbacks=[Stamp()])
    trainer.fit(model, datamodule=dm)
    if trainer.global_rank == 0:
        seconds = stamps[-1] - stamps[args.warmup_steps - 1]
        sentences = args.steps * args.batch_size * 2 * trainer.world_size
        print(json.dumps({"model": name, "world_size": trainer.world_size,
                                      "sentences_per_s": sentences / seconds, "steps_per_s": args.steps / seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sts_dir", required=True, help="holds stsb.test.tsv (the sentences encoded)")
    parser.add_argument("--nli", required=True, help="an NLI file (premise, hypothesis, label) for training")
    parser.add_argument("--accelerator", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--devices", type=int, default=None, help="default: every visible GPU (1 on CPU)")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--encode_batch_size", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=64, help="training batch per device")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps")
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="encode only the first N sentences (dry runs)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--compile", action="store_true",
                        help="train with the encoder's compile option (widths bucketed by 16; give --warmup_steps "
                             "enough steps to meet every bucket, e.g. 50, so compiling stays out of the timed steps)")
    parser.add_argument("--train_model", choices=MODELS, help=argparse.SUPPRESS)  # the child's one model
    args = parser.parse_args()
    import torch

    if args.devices is None:
        args.devices = torch.cuda.device_count() if args.accelerator == "gpu" else 1
    if args.accelerator == "gpu" and not torch.cuda.is_available():
        sys.exit("gpu_throughput.py: no CUDA device here (run with --accelerator cpu for a dry run)")
    os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="gpu-throughput-"))
    if args.train_model:
        train_rate(args, args.train_model)
        return

    info = machine()
    if args.accelerator == "gpu":
        info["gpu"] = torch.cuda.get_device_name(0)
    print_machine(info)
    from datamodules.sts import load_sts_pairs

    pairs = load_sts_pairs(os.path.join(args.sts_dir, "stsb.test.tsv"))
    sentences = (list(pairs["sentence1"]) + list(pairs["sentence2"]))[: args.limit]
    encoding = encode_rates(args, sentences)
    print(f"\nEncoding {len(sentences)} STS-B test sentences, batch {args.encode_batch_size}")
    print("| program | sentences/s | / SBERT paper's 2,042 (V100, fp32) |\n|---|---|---|")
    for name, rate in encoding.items():
        print(f"| {name} | {rate:,.0f} | {rate / SBERT_V100:.2f}x |")

    training = {}
    for name in MODELS:
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--train_model", name]
        training[name] = run_child(cmd, f"training {name}")
    print(f"\nTraining MNR, batch {args.batch_size} per device, {args.precision}, DDP gather on"
          + (", compiled" if args.compile else ""))
    print("| model | devices | steps/s | sentences/s |\n|---|---|---|---|")
    for name, r in training.items():
        print(f"| {name} | {r['world_size']} | {r['steps_per_s']:.2f} | {r['sentences_per_s']:,.0f} |")
    print(json.dumps({"benchmark": "gpu_throughput", "machine": info, "sentences": len(sentences),
                      "encode_sentences_per_s": {k: round(v, 1) for k, v in encoding.items()},
                      "sbert_paper_v100": SBERT_V100, "training": training}))


if __name__ == "__main__":
    main()
