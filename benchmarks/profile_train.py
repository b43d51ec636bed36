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
import json
import logging
import os
import shutil
import tempfile

from common import machine, print_machine, set_threads
from train_throughput import identical_batches, run_ours, run_theirs

PHASES = {  # SimpleProfiler action -> the name printed
    "run_training_batch": "whole step (training_step + backward + optimizer step)",
    "[Strategy]SingleDeviceStrategy.training_step": "training_step (forward, loss, self.log)",
    "[Strategy]SingleDeviceStrategy.backward": "backward",
    "[LightningModule]MNR.optimizer_step": "optimizer step (closure excluded below)",
    "[LightningModule]MNR.optimizer_zero_grad": "zero_grad",
}


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
    return {"steps_per_s": round(rate, 3), "phases_ms": phases, "top_ops_ms": op_table(ops, args.steps, args.top)}


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
    return {"steps_per_s": round(rate, 3), "top_ops_ms": op_table(ops, args.steps, args.top)}


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
        print(json.dumps({"benchmark": "profile_train", "machine": info, "precision": args.precision,
                          "batch_size": args.batch_size, "max_length": args.max_length, "steps": args.steps, **out}))
    finally:
        shutil.rmtree(args.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
