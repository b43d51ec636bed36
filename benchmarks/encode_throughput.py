"""Sentences/s of ``SentenceEncoder.encode`` vs ``SentenceTransformer.encode``, and what bf16 costs in STS.

Same weights (the offline all-MiniLM-L6-v2), same sentences (the STS-B test set, both sides),
same batch size, same device and threads. Settings: ours fp32 vs theirs fp32, then ours with
``precision="bf16"`` vs theirs fp32; ours is padding-free as shipped (``encoders/unpadded.py``) and,
as a second program of each precision, padded (``padding_free=False``), so one run gives
padding-free / padded as well. The programs run in turns, order rotated each repetition;
reported is the median over repetitions of the per-repetition ratio ours/theirs (sentences/s).
Then the seven-task STS average of ours in fp32 and in bf16 (a few minutes; ``--skip_quality``).

    python benchmarks/encode_throughput.py --sts_dir $SENTEMB_DATA/sts [--reps 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import statistics

from common import alternate, machine, median_ratio, print_machine, set_threads, spread  # noqa: I001 (sets sys.path)


MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sts_dir", required=True, help="directory holding stsb.test.tsv (and the STS tasks)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--skip_quality", action="store_true", help="skip the STS fp32 vs bf16 comparison")
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                        help="ours in these (bf16 only where the CPU has bf16 units: emulated, it is ~40x slower)")
    args = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    from datamodules import load_sts_pairs
    from encoders.sentence import SentenceEncoder
    from encoders.hub import resolve_model_name
    from harness.sts_eval import evaluate_sts

    threads = set_threads(args.threads)
    info = machine(threads)
    print_machine(info)
    pairs = load_sts_pairs(f"{args.sts_dir}/stsb.test.tsv")
    sentences = list(pairs["sentence1"]) + list(pairs["sentence2"])
    ours = SentenceEncoder(MODEL).eval()
    padded = SentenceEncoder(MODEL, padding_free=False).eval()
    theirs = SentenceTransformer(resolve_model_name(MODEL), device="cpu")
    bs = args.batch_size

    # Same computation? Their model ends in Normalize: compare unit vectors.
    a = ours.encode(sentences[:256], batch_size=bs, normalize=True)
    b = theirs.encode(sentences[:256], batch_size=bs, convert_to_tensor=True, normalize_embeddings=True)
    max_diff = float((a - b).abs().max())
    print(f"{len(sentences)} sentences (STS-B test), batch {bs}; max |ours - theirs| of unit embeddings: {max_diff:.2e}")

    programs = {
        "theirs fp32": lambda: theirs.encode(sentences, batch_size=bs, convert_to_tensor=True),
        "ours fp32": lambda: ours.encode(sentences, batch_size=bs),
        "ours fp32 padded": lambda: padded.encode(sentences, batch_size=bs),
        "ours bf16": lambda: ours.encode(sentences, batch_size=bs, precision="bf16"),
        "ours bf16 padded": lambda: padded.encode(sentences, batch_size=bs, precision="bf16"),
    }
    programs = {k: v for k, v in programs.items() if k.startswith("theirs") or k.split()[1] in args.precisions}
    warm = sentences[:256]  # warm-up: allocator, oneDNN kernels, autocast
    theirs.encode(warm, batch_size=bs)
    for enc in (ours, padded):
        for p in args.precisions:
            enc.encode(warm, batch_size=bs, precision={"fp32": "32", "bf16": "bf16"}[p])
    t = alternate(programs, args.reps)
    n = len(sentences)
    rate = {name: statistics.median(n / s for s in secs) for name, secs in t.wall.items()}
    ratios = {name: median_ratio(t.wall["theirs fp32"], t.wall[name]) for name in programs}
    cpu_ratios = {name: median_ratio(t.cpu["theirs fp32"], t.cpu[name]) for name in programs}
    ratio_fp32, ratio_bf16 = ratios.get("ours fp32", float("nan")), ratios.get("ours bf16", float("nan"))

    print(f"\n| program | sentences/s (median of {args.reps}) | range | ours/theirs (wall) | ours/theirs (CPU time) |")
    print("|---|---|---|---|---|")
    for name in programs:
        print(f"| {name} | {rate[name]:.0f} | {spread([n / s for s in t.wall[name]])} | {ratios[name]:.2f}x "
              f"| {cpu_ratios[name]:.2f}x |")
    free_over_padded = {p: median_ratio(t.wall[f"ours {p} padded"], t.wall[f"ours {p}"]) for p in args.precisions}
    print("padding-free / padded: " + "; ".join(f"{p} {r:.2f}x" for p, r in free_over_padded.items()))

    quality = {}
    if not args.skip_quality and "bf16" in args.precisions:
        for precision in ("32", "bf16"):
            res = evaluate_sts(lambda s: ours.encode(s, batch_size=bs, precision=precision), args.sts_dir)
            quality[precision] = {k: round(v, 2) for k, v in res.items() if isinstance(v, float)}
        diff = quality["bf16"]["avg"] - quality["32"]["avg"]
        print("\n| precision | " + " | ".join(k for k in quality["32"]) + " |")
        print("|---|" + "---|" * len(quality["32"]))
        for precision, res in quality.items():
            print(f"| {precision} | " + " | ".join(f"{v:.2f}" for v in res.values()) + " |")
        print(f"bf16 - fp32 STS average: {diff:+.2f} points")

    print(json.dumps({
        "benchmark": "encode_throughput", "machine": info, "sentences": len(sentences), "batch_size": bs,
        "reps": args.reps, "max_abs_diff_unit_embeddings": max_diff,
        "sentences_per_s": {k: round(v, 1) for k, v in rate.items()},
        "ratio_fp32": round(ratio_fp32, 3), "ratio_bf16": round(ratio_bf16, 3),
        "padding_free_over_padded": {k: round(v, 3) for k, v in free_over_padded.items()},
        "cpu_time_ratio_fp32": round(cpu_ratios.get("ours fp32", float("nan")), 3),
        "cpu_time_ratio_bf16": round(cpu_ratios.get("ours bf16", float("nan")), 3),
        "sts_avg_fp32": quality.get("32", {}).get("avg"), "sts_avg_bf16": quality.get("bf16", {}).get("avg"),
        "sts_avg_bf16_minus_fp32": round(quality["bf16"]["avg"] - quality["32"]["avg"], 2) if quality else None,
    }))


if __name__ == "__main__":
    main()
