"""Where our MNR training step spends its time: Lightning's phases and torch's operators.

Trains our MNR exactly as ``train_throughput.py`` does (offline all-MiniLM-L6-v2, the entailment
pairs of ``DIR/nli/snli.test.tsv``, no-duplicate batches without length grouping, AdamW with 10%
warmup, bf16-mixed by default) for ``--warmup_steps + --steps`` steps, and prints over the last
``--steps``:

- Lightning's ``SimpleProfiler`` phases (training_step = forward + loss, backward, optimizer
  step, hooks and logging), mean milliseconds per step;
- torch.profiler's operators by self CPU time, so the kernels behind each phase are named.

The profile of a step answers "why is ours slower or faster than theirs" where the throughput
benchmark only says by how much.

    python benchmarks/profile_train.py --data_dir $SENTEMB_DATA --threads 1
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile

from common import machine, print_machine, set_threads, write_record
from train_throughput import identical_batches, run_ours, run_theirs

LAYERS = 6  # all-MiniLM-L6-v2's transformer layers
PHASES = {  # SimpleProfiler action -> the name printed
    "run_training_batch": "whole step (training_step + backward + optimizer step)",
    "[Strategy]SingleDeviceStrategy.training_step": "training_step (forward, loss, self.log)",
    "[Strategy]SingleDeviceStrategy.backward": "backward",
    "[LightningModule]MNR.optimizer_step": "optimizer step (closure excluded below)",
    "[LightningModule]MNR.optimizer_zero_grad": "zero_grad",
}


# What each operator is for, by name: the padding-free path's own work (packing real tokens and scattering them back
# into a padded layout for attention) against the matrix products, attention and the elementwise rest.
CATEGORIES = (
    ("matmul (linear layers)", ("addmm", "aten::mm", "aten::bmm", "matmul", "aten::linear")),
    ("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention", "softmax")),
    ("packing (gather, scatter, re-pad)", ("index_select", "index_copy", "index_put", "aten::index", "nonzero",
                                           "masked", "scatter", "gather", "constant_pad", "aten::pad", "cumsum")),
    ("optimizer", ("_fused_adamw", "_fused_adam", "adam")),
    ("norm, activation, dropout", ("layer_norm", "gelu", "dropout", "native_layer_norm", "bernoulli", "tanh")),
)


def categories(ops, steps: int, layers: int) -> dict[str, float]:
    """Self CPU ms per step of each category (``CATEGORIES``; the rest as "other"), and per transformer layer."""
    totals = {name: 0.0 for name, _ in CATEGORIES}
    totals["other"] = 0.0
    for event in ops.key_averages():
        ms = event.self_cpu_time_total / 1000 / steps
        name = next((c for c, keys in CATEGORIES if any(k in event.key for k in keys)), "other")
        totals[name] += ms
    step = sum(totals.values())
    print(f"\n| category | ms/step | ms/layer ({layers} layers) | share |\n|---|---|---|---|")
    for name, ms in totals.items():
        print(f"| {name} | {ms:.1f} | {ms / layers:.1f} | {ms / step:.0%} |")
    return {name: round(ms, 2) for name, ms in totals.items()}


def op_table(ops, steps: int, top: int) -> dict[str, float]:
    """Print torch.profiler's top operators by self CPU time; return them as ms per step."""
    print(ops.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=48))
    events = sorted(ops.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {e.key: round(e.self_cpu_time_total / 1000 / steps, 1) for e in events}


def profile_ours(args):
    import lightning as L
    from lightning.pytorch.profilers import SimpleProfiler
    from torch.profiler import ProfilerActivity, profile

    ops, simple = profile(activities=[ProfilerActivity.CPU]), SimpleProfiler()

    class Window(L.Callback):
        """Profile (and phase-time) only the steps after the warm-up ones."""

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == args.warmup_steps:
                simple.recorded_durations.clear()
                ops.__enter__()

        def on_train_end(self, trainer, module):
            ops.__exit__(None, None, None)

    if args.keep_freed_memory:  # as train.py does by default
        from harness.allocator import keep_freed_memory

        keep_freed_memory()
    rate = run_ours(args, group_by_length=False, callbacks=(Window(),), profiler=simple,
                    compile=args.compile)["steps_per_s"]
    durations = simple.recorded_durations
    total = lambda action: 1000 * sum(durations.get(action, [])) / args.steps  # noqa: E731
    step_ms = total("run_training_batch")
    print(f"\nours: {rate:.3f} steps/s; Lightning phases, mean ms per step over {args.steps} steps")
    print("| phase | ms/step | share of the step |\n|---|---|---|")
    phases = {}
    for action, label in PHASES.items():
        ms = total(action)
        if action == "[LightningModule]MNR.optimizer_step":  # the closure (forward+backward) runs inside it
            ms -= total("[Strategy]SingleDeviceStrategy.training_step") + total("[Strategy]SingleDeviceStrategy.backward")
        phases[label] = round(ms, 1)
        print(f"| {label} | {ms:.1f} | {ms / step_ms:.0%} |")
    print(f"\nours: torch.profiler, top {args.top} operators by self CPU time over the same steps")
    top = op_table(ops, args.steps, args.top)
    return {"steps_per_s": round(rate, 3), "phases_ms": phases, "top_ops_ms": top,
            "categories_ms": categories(ops, args.steps, LAYERS)}


def profile_theirs(args, pairs, batches):
    from torch.profiler import ProfilerActivity, profile
    from transformers import TrainerCallback

    ops = profile(activities=[ProfilerActivity.CPU])

    class Window(TrainerCallback):
        def on_step_begin(self, targs, state, control, **kwargs):
            if state.global_step == args.warmup_steps:
                ops.__enter__()

        def on_train_end(self, *_, **__):
            ops.__exit__(None, None, None)

    rate = run_theirs(args, batches, pairs, callbacks=(Window(),))["steps_per_s"]
    print(f"\ntheirs: {rate:.3f} steps/s; torch.profiler, top {args.top} operators by self CPU time")
    top = op_table(ops, args.steps, args.top)
    return {"steps_per_s": round(rate, 3), "top_ops_ms": top, "categories_ms": categories(ops, args.steps, LAYERS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", required=True, help="holds nli/snli.test.tsv")
    parser.add_argument("--program", choices=["ours", "theirs", "both"], default="both")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--precision", choices=["bf16", "32"], default="bf16")
    parser.add_argument("--steps", type=int, default=6, help="profiled steps")
    parser.add_argument("--warmup_steps", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="ours with model.encoder.compile")
    parser.add_argument("--keep_freed_memory", type=int, choices=[0, 1], default=1,
                        help="ours with glibc's freed memory kept, as train.py runs (1) or malloc's defaults (0)")
    parser.add_argument("--top", type=int, default=15, help="operators to print")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    info = machine(set_threads(args.threads))
    print_machine(info)
    args.tmp = tempfile.mkdtemp(prefix="profile-train-")
    os.environ["HF_DATASETS_CACHE"] = os.path.join(args.tmp, "hf-datasets-cache")
    import transformers

    transformers.logging.set_verbosity_error()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    try:
        out = {}
        if args.program in ("ours", "both"):
            out["ours"] = profile_ours(args)
        if args.program in ("theirs", "both"):
            out["theirs"] = profile_theirs(args, *identical_batches(args))
        figures = {f"{side} {key} ms": ms for side, res in out.items() for key, ms in res["categories_ms"].items()}
        figures.update({f"{side} steps/s": res["steps_per_s"] for side, res in out.items()})
        write_record("profile_train", figures, info["threads"], notes={
            "precision": args.precision, "batch_size": args.batch_size, "max_length": args.max_length,
            "steps": args.steps, "layers": LAYERS, "top_ops_ms": {side: res["top_ops_ms"] for side, res in out.items()}})
    finally:
        shutil.rmtree(args.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
