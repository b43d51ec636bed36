"""Objective overhead: step time of DCLR over unsupervised SimCSE, and of GradCache MNR over plain
MNR at the same batch, with the peak memory of each.

    python benchmarks/objective_overhead.py --wiki $SENTEMB_DATA/wiki/wiki_sentences.txt

Step times come from one process, the programs alternating (benchmarks/common.py). Peak memory
is measured in a fresh subprocess per setting: resident memory after the model is built and one
warm-up step of the *smallest* setting, against the process's peak after the measured steps
(CPU tensors are not seen by tracemalloc, so resident memory is the honest measure here).
A step is a full training step: the objective's loss, backward and an AdamW update, under bf16
autocast as ``precision: bf16-mixed`` runs it.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys

from common import alternate, machine, median_ratio, print_machine, run_child, set_threads

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def reset_peak_rss() -> None:
    """Start a new peak-RSS window (Linux >= 4.0: writing 5 to clear_refs resets VmHWM), so the
    peak measured is that of the steps, not of model loading before them."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def build(objective: str, mini_batch: int | None):
    from lightning_modules.dclr import DCLR
    from encoders.sentence import SentenceEncoder
    from lightning_modules.mnr import MNR
    from lightning_modules.simcse import SimCSE

    encoder = SentenceEncoder(MODEL, max_seq_length=32)
    if objective == "simcse":
        return SimCSE(encoder, mini_batch_size=mini_batch)
    if objective == "dclr":
        return DCLR(encoder, complementary_model=MODEL, complementary_pooling="mean", phi=0.9, noise_ratio=1.0)
    return MNR(encoder, mini_batch_size=mini_batch)


def make_batch(module, sentences: list[str], objective: str) -> dict:
    tok = module.encoder.tokenize
    if objective in ("simcse", "dclr"):
        return {"sentence": tok(sentences)}
    half = len(sentences) // 2  # pairs: anchor = a sentence, positive = another one (timing only)
    return {"anchor": tok(sentences[:half] * 2), "positive": tok(sentences[half:] * 2)}


def stepper(module, batch: dict):
    import torch

    optimizer = torch.optim.AdamW([p for _, p in module.trainable_parameters()], lr=1e-5)
    module.train()
    for m in module.frozen_modules():
        m.eval()

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = module.training_loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def memory_child(objective: str, batch: int, mini_batch: int | None, sentences: list[str], steps: int) -> dict:
    import torch

    torch.manual_seed(0)
    module = build(objective, mini_batch)
    warm = stepper(module, make_batch(module, sentences[:8], objective))
    warm()  # optimizer state and allocator warmed on a tiny batch
    step = stepper(module, make_batch(module, sentences[:batch], objective))
    reset_peak_rss()
    base = rss_mib()
    for _ in range(steps):
        step()
    peak = peak_rss_mib()
    return {"objective": objective, "batch": batch, "mini_batch": mini_batch, "base_mib": round(base, 1),
            "peak_increase_mib": round(peak - base, 1)}


def measure_memory(args, objective: str, batch: int, mini_batch: int | None) -> dict:
    cmd = [sys.executable, __file__, "--wiki", args.wiki, "--child", objective, str(batch), str(mini_batch or 0),
           "--threads", str(args.threads or 0)]
    return run_child(cmd, f"memory of {objective}, batch {batch}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wiki", required=True, help="one sentence per line ($SENTEMB_DATA/wiki/wiki_sentences.txt)")
    parser.add_argument("--batch", type=int, default=64, help="batch for the SimCSE/DCLR step-time comparison")
    parser.add_argument("--big_batch", type=int, default=512, help="GradCache batch")
    parser.add_argument("--mini_batch", type=int, default=32, help="GradCache mini-batch")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sentences = [l.strip() for l in open(args.wiki, encoding="utf-8") if l.strip()]
    random.Random(0).shuffle(sentences)
    set_threads(args.threads or None)
    if args.child:
        objective, batch, mini = args.child
        print(json.dumps(memory_child(objective, int(batch), int(mini) or None, sentences, steps=2)))
        return

    import torch

    info = machine()
    print_machine(info)
    torch.manual_seed(0)
    modules = {name: build(obj, mini) for name, (obj, mini) in
               {"simcse": ("simcse", None), "dclr": ("dclr", None), "mnr": ("mnr", None),
                "mnr_gradcache": ("mnr", args.mini_batch)}.items()}
    small = {n: stepper(modules[n], make_batch(modules[n], sentences[:args.batch], n.split("_")[0]))
             for n in ("simcse", "dclr")}
    big = {n: stepper(modules[n], make_batch(modules[n], sentences[:args.big_batch], "mnr"))
           for n in ("mnr", "mnr_gradcache")}
    for step in (*small.values(), *big.values()):
        step()  # warm-up
    t_small = alternate(small, args.reps).wall
    t_big = alternate(big, max(2, args.reps // 2)).wall
    memory = []
    for objective, batch, mini in [("simcse", args.batch, None), ("dclr", args.batch, None),
                                   ("mnr", args.mini_batch, None), ("mnr", args.big_batch, args.mini_batch),
                                   ("mnr", args.big_batch, None)]:
        memory.append(measure_memory(args, objective, batch, mini))
        print("memory:", json.dumps(memory[-1]), flush=True)
    result = {
        "machine": info,
        "simcse_step_s": statistics.median(t_small["simcse"]), "dclr_step_s": statistics.median(t_small["dclr"]),
        "dclr_over_simcse": median_ratio(t_small["dclr"], t_small["simcse"]),
        "mnr_step_s": statistics.median(t_big["mnr"]), "mnr_gradcache_step_s": statistics.median(t_big["mnr_gradcache"]),
        "gradcache_over_plain": median_ratio(t_big["mnr_gradcache"], t_big["mnr"]),
        "memory": memory,
    }
    print(f"\nstep time, batch {args.batch}, bf16: SimCSE {result['simcse_step_s']:.2f} s, DCLR {result['dclr_step_s']:.2f} s "
          f"-> DCLR/SimCSE {result['dclr_over_simcse']:.2f}x")
    print(f"step time, batch {args.big_batch} (pairs), bf16: MNR {result['mnr_step_s']:.2f} s, GradCache MNR "
          f"(mini-batch {args.mini_batch}) {result['mnr_gradcache_step_s']:.2f} s -> {result['gradcache_over_plain']:.2f}x")
    print("\n| objective | batch | mini-batch | peak memory increase (MiB) |\n|---|---|---|---|")
    for m in memory:
        print(f"| {m['objective']} | {m['batch']} | {m['mini_batch'] or '-'} | {m['peak_increase_mib']} |")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
