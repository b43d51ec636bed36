"""Model FLOPs/s in encoding and training, as a fraction of a large matmul's FLOPs/s, same run.

FLOPs counted two ways: over the padded batch (every token position of (B, s), padding included),
and over the real tokens only (each sequence at its own length n_i: 2 * P * sum(n_i) + 4 * L *
sum(n_i^2) * h). The real-token count is the useful work, the same for the padded and the
padding-free path (``encoders/unpadded.py``), so it is the one that compares them:
  forward, per batch of B sequences padded to width s, over the L transformer layers:
      2 * P * B * s            every Linear of the layers (P = their weight count: Q, K, V,
                               attention output, FFN in and out; embeddings, LayerNorms, biases
                               and BERT's unused pooler are not counted)
    + 4 * L * B * s^2 * h      attention scores Q K^T and the weighted sum A V (2 s^2 h each)
  training step = 3 x forward (backward = 2 x forward); the AdamW update is not counted.
Softmax, GELU, LayerNorm, dropout and the optimizer are work the count ignores, so they
lower the achieved fraction, as they should.

The ceiling is ``torch.mm`` of two N x N matrices (2 N^3 FLOPs) in bf16 and in fp32, measured
in the same run, in turns with the model programs (order rotated each repetition); reported is
the median over repetitions of (model FLOPs/s) / (matmul FLOPs/s of the same precision).

Model: all-MiniLM-L6-v2 (offline). Encoding: ``SentenceEncoder.encode`` (batch 64, real
sentences, the model's own length-sorted batching), padding-free as shipped. Training: forward +
backward + AdamW on 64 sentences x 2 dropout views (a SimCSE step) at max length 32: padding-free
(as shipped), padded (``padding_free=False``), and padded with the encoder's ``compile`` option
(one static shape, compiled during the warm-up, which is not timed). The training sentences are 64
random lines of ``--wiki`` (SimCSE's data; about three quarters real tokens at max length 32), or
without it three fixture sentences joined per row, which fill max length (no padding). The process
keeps freed memory (``harness/allocator.py``), as ``train.py`` does.

    python benchmarks/hardware_utilisation.py --wiki $SENTEMB_DATA/wiki/wiki_sentences.txt [--sentences FILE] [--threads 1] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from common import ROOT, alternate, machine, print_machine, set_threads

import torch  # noqa: E402
from torch import nn  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def linear_weights_in_layers(transformer: nn.Module) -> int:
    """P: weights of every nn.Linear inside the transformer's layers (not embeddings, not pooler)."""
    layers = transformer.encoder.layer
    return sum(m.weight.numel() for layer in layers for m in layer.modules() if isinstance(m, nn.Linear))


def forward_flops(shapes: list[tuple[int, int]], P: int, L: int, h: int) -> float:
    """Model FLOPs of a forward pass over batches of the given (B, s) shapes."""
    return float(sum(2 * P * B * s + 4 * L * B * s * s * h for B, s in shapes))


def real_flops(lengths: list[int], P: int, L: int, h: int) -> float:
    """Model FLOPs of a forward pass over sequences of these real lengths, each attending to itself only."""
    return float(sum(2 * P * n + 4 * L * n * n * h for n in lengths))


def encode_shapes(encoder, sentences: list[str], batch_size: int) -> tuple[list[tuple[int, int]], int]:
    """The (B, s) shapes encode() runs (token-count order), and the non-padding token count."""
    ids = encoder.tokenizer(sentences, truncation=True, max_length=encoder.eval_max_length)["input_ids"]
    lengths = sorted((len(x) for x in ids), reverse=True)
    shapes = [(len(lengths[i:i + batch_size]), lengths[i]) for i in range(0, len(lengths), batch_size)]
    return shapes, lengths


def read_sentences(path: str | None) -> list[str]:
    if path:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    out = []  # default: every sentence of the project's own fixtures
    for tsv in sorted((ROOT / "tests" / "fixtures" / "sts").glob("*.tsv")):
        for line in tsv.read_text(encoding="utf-8").splitlines()[1:]:
            out += [s for s in line.split("\t")[:2] if s.strip()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", help="one sentence per line (default: the fixture STS sentences)")
    parser.add_argument("--wiki", help="training sentences, one per line (default: joined fixture sentences)")
    parser.add_argument("--seed", type=int, default=0, help="which --wiki lines make the training batch")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--train_max_length", type=int, default=32)
    parser.add_argument("--matmul_n", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                        help="programs in these (bf16 only where the CPU has bf16 units: emulated, it is ~40x slower)")
    args = parser.parse_args()

    from encoders.sentence import SentenceEncoder
    from harness.allocator import keep_freed_memory

    keep_freed_memory()

    info = machine(set_threads(args.threads))
    print_machine(info)
    sentences = read_sentences(args.sentences)
    encoder = SentenceEncoder(MODEL, max_seq_length=args.train_max_length)
    cfg = encoder.transformer.config
    P, L, h = linear_weights_in_layers(encoder.transformer), cfg.num_hidden_layers, cfg.hidden_size
    bs = args.batch_size

    enc_shapes, enc_lengths = encode_shapes(encoder, sentences, bs)
    real_tokens = sum(enc_lengths)
    enc_flops = forward_flops(enc_shapes, P, L, h)
    enc_real_flops = real_flops(enc_lengths, P, L, h)
    enc_tokens = sum(B * s for B, s in enc_shapes)

    if args.wiki:
        with open(args.wiki, encoding="utf-8") as f:
            wiki = [line.strip() for line in f if line.strip()]
        train_sentences = random.Random(args.seed).sample(wiki, bs)
    else:  # three sentences joined: every training sequence fills max length
        joined = [" ".join(sentences[i:i + 3]) for i in range(0, len(sentences), 3)]
        train_sentences = (joined * (bs // max(len(joined), 1) + 1))[:bs]
    features = encoder.tokenize(train_sentences)  # truncated at train_max_length
    features = {k: torch.cat([v, v]) for k, v in features.items()}  # (2B, s): two dropout views
    B2, s = features["input_ids"].shape
    train_flops = 3 * forward_flops([(B2, s)], P, L, h)
    train_real = int(features["attention_mask"].sum())
    train_real_flops = 3 * real_flops(features["attention_mask"].sum(1).tolist(), P, L, h)
    # fused, as the objectives' configure_optimizers builds it
    padded = SentenceEncoder(MODEL, max_seq_length=args.train_max_length, padding_free=False)
    compiled = SentenceEncoder(MODEL, max_seq_length=args.train_max_length, compile=True)
    optimizers = {id(m): torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-5, fused=True)
                  for m in (encoder, padded, compiled)}
    precisions = [p for p in ("fp32", "bf16") if p in args.precisions]

    def train_step(dtype, model=encoder):
        optimizer = optimizers[id(model)]

        def step():
            model.train()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype in ("bf16", "bf16 compiled")):
                loss = model(features).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step

    n = args.matmul_n
    mats = {dt: (torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)) for dt in (torch.float32, torch.bfloat16)}
    mm_reps = 5
    mm_flops = 2.0 * n ** 3 * mm_reps

    def matmul(dt):
        a, b = mats[dt]
        return lambda: [torch.mm(a, b) for _ in range(mm_reps)]

    programs = {}
    for p in precisions:
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[p]
        programs.update({
            f"matmul {p}": matmul(dt),
            f"encode {p}": lambda p=p: encoder.encode(sentences, batch_size=bs, precision={"fp32": "32"}.get(p, p)),
            f"train {p}": train_step(p), f"train {p} padded": train_step(p, padded),
        })
    if "bf16" in precisions:
        programs["train bf16 compiled"] = train_step("bf16", compiled)
    trained = [k for k in programs if k.startswith("train")]
    flops = {**{f"matmul {p}": mm_flops for p in precisions}, **{f"encode {p}": enc_flops for p in precisions},
             **{k: train_flops for k in trained}}
    useful = {**{f"encode {p}": enc_real_flops for p in precisions}, **{k: train_real_flops for k in trained}}
    compile_s = None
    for name, fn in programs.items():  # warm-up (the compiled program compiles here)
        start = time.perf_counter()
        fn()
        if name == "train bf16 compiled":
            compile_s = time.perf_counter() - start
            fn()  # one more untimed step, so the compiled program is warm as the others are
    t = alternate(programs, args.reps)
    gflops = {k: statistics.median(flops[k] / s / 1e9 for s in t.wall[k]) for k in programs}
    fraction, real_fraction = {}, {}
    for k in useful:
        ceiling = "matmul " + k.split()[1]
        fraction[k] = statistics.median((flops[k] / a) / (mm_flops / b) for a, b in zip(t.wall[k], t.wall[ceiling]))
        real_fraction[k] = statistics.median((useful[k] / a) / (mm_flops / b)
                                             for a, b in zip(t.wall[k], t.wall[ceiling]))
    step_ratio = {p: statistics.median(b / a for a, b in zip(t.wall[f"train {p}"], t.wall[f"train {p} padded"]))
                  for p in precisions}

    print(f"\nMiniLM-L6: P = {P:,} layer weights, L = {L}, h = {h}; matmul {n}x{n}")
    print(f"encode: {len(sentences)} sentences, {enc_tokens:,} tokens computed ({real_tokens / enc_tokens:.0%} non-padding), "
          f"{enc_flops / 1e9:.1f} GFLOP per pass")
    print(f"train step: {B2} x {s} tokens ({train_real / (B2 * s):.0%} non-padding), {train_flops / 1e9:.1f} GFLOP")
    print(f"\n| program | GFLOP/s, padded count (median of {args.reps}) | fraction of same-precision matmul, "
          "padded count | same, real tokens only |")
    print("|---|---|---|---|")
    for k in programs:
        print(f"| {k} | {gflops[k]:.1f} | " + (f"{fraction[k]:.0%} | {real_fraction[k]:.0%} |" if k in fraction
                                               else "100% (ceiling) | |"))
    if compile_s is not None:
        print(f"compiled training: first step (compiling) {compile_s:.0f} s")
    print(f"SimCSE step ({B2} x {s}, {train_real / (B2 * s):.0%} real tokens), padding-free / padded: "
          + "; ".join(f"{p} {r:.2f}x" for p, r in step_ratio.items()))
    if "bf16" in precisions:
        best = max(real_fraction["train bf16"], real_fraction["train bf16 compiled"])
        print(f"bf16 training, real tokens only: {best:.0%} of the bf16 matmul ceiling")
    print(json.dumps({"benchmark": "hardware_utilisation", "machine": info, "P": P, "L": L, "h": h,
                      "gflops_per_s": {k: round(v, 1) for k, v in gflops.items()},
                      "fraction_of_matmul": {k: round(v, 3) for k, v in fraction.items()},
                      "real_token_fraction_of_matmul": {k: round(v, 3) for k, v in real_fraction.items()},
                      "train_non_padding": round(train_real / (B2 * s), 3),
                      "simcse_step_padding_free_over_padded": {k: round(v, 3) for k, v in step_ratio.items()},
                      "encode_non_padding": round(real_tokens / enc_tokens, 3),
                      "train_shape": [B2, s], "compile_s": compile_s and round(compile_s, 1)}))


if __name__ == "__main__":
    main()
