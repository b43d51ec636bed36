"""Our transfer protocol (``harness/transfer.py``) against SentEval's own code, on the same embeddings.

Both sides get identical, cached sentence embeddings (the offline all-MiniLM-L6-v2, fp32, computed
once), so any difference comes from the classifiers alone. SentEval's side runs its own
``MREval``/``CREval``/.../``MRPCEval`` classes (``run(params, batcher)``, the batcher looking each
sentence up in the cache) with SimCSE's ``--mode test`` parameters (``kfold 10``, ``nhid 0``, Adam,
batch 64, tenacity 5, epoch size 4) on the CPU; ours runs ``evaluate_transfer`` with the same
settings. Per task: test accuracy (and MRPC's F1) of each side and the seconds each took, one torch
thread by default.

SentEval's code is not part of this project: give the folder that holds its ``senteval`` package
(a clone of facebookresearch/SentEval, here beside this one) with ``--senteval_path``. Its classifier calls ``.cuda()``;
here that call is made a no-op so it runs on the CPU, which changes nothing else.

    python benchmarks/transfer_parity.py --data_dir $SENTEMB_DATA/senteval --senteval_path ../SentEval \\
        --output transfer_parity.json [--tasks mr,cr] [--side both|ours|senteval] [--threads 1]

Each task's result is merged into ``--output`` as soon as it is known, and tasks already there are
skipped, so a long run can be stopped and resumed, or split into one call per task.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from common import machine, print_machine, set_threads  # noqa: I001 (sets sys.path)

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SENTEVAL_CLASSES = {"mr": "binary.MREval", "cr": "binary.CREval", "subj": "binary.SUBJEval",
                    "mpqa": "binary.MPQAEval", "sst2": "sst.SSTEval", "trec": "trec.TRECEval",
                    "mrpc": "mrpc.MRPCEval"}


def task_sentences(root: str, tasks: list[str]) -> list[str]:
    """Every sentence of the tasks, as both sides embed it (tokens joined by single spaces)."""
    from harness import transfer as tr

    out: list[str] = []
    for task in tasks:
        paths = tr.task_paths(root, task)
        if task in ("mr", "cr", "subj", "mpqa"):
            out += tr.load_binary(*paths)[0]
        elif task == "sst2":
            out += [s for p in paths for s in tr.load_sst(p)[0]]
        elif task == "trec":
            out += [s for p in paths for s in tr.load_trec(p)[0]]
        else:
            for p in paths:
                a, b, _ = tr.load_mrpc(p)
                out += a + b
    return list(dict.fromkeys(out))


def cached_embeddings(path: str, sentences: list[str], batch_size: int) -> dict[str, int]:
    """Embed the sentences missing from the cache file, save, and return {sentence: row} with the matrix."""
    import torch

    from encoders.sentence import SentenceEncoder

    cache = torch.load(path) if os.path.exists(path) else {"sentences": [], "embeddings": torch.empty(0, 0)}
    known = set(cache["sentences"])
    missing = [s for s in sentences if s not in known]
    if missing:
        start = time.perf_counter()
        encoder = SentenceEncoder(MODEL).eval()
        emb = encoder.encode(missing, batch_size=batch_size)  # (M, H) float32
        print(f"embedded {len(missing)} sentences in {time.perf_counter() - start:.0f} s", flush=True)
        old = cache["embeddings"]
        cache = {"sentences": cache["sentences"] + missing,
                 "embeddings": emb if old.numel() == 0 else torch.cat([old, emb])}
        torch.save(cache, path)
    return cache


def run_senteval(task: str, root: str, lookup, senteval_path: str, seed: int) -> dict:
    import importlib

    import numpy as np
    import torch

    if senteval_path not in sys.path:
        sys.path.insert(0, senteval_path)
    # SentEval's classifier moves everything with .cuda(); on a CPU machine that is the identity.
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    utils = importlib.import_module("senteval.utils")
    module, name = SENTEVAL_CLASSES[task].split(".")
    cls = getattr(importlib.import_module(f"senteval.{module}"), name)
    from harness.transfer import TASK_FILES

    folder = os.path.join(root, TASK_FILES[task][0])
    evaluation = cls(folder, nclasses=2, seed=seed) if task == "sst2" else cls(folder, seed=seed)
    params = utils.dotdict({"task_path": root, "usepytorch": True, "kfold": 10, "seed": seed, "batch_size": 128,
                            "nhid": 0, "classifier": {"nhid": 0, "optim": "adam", "batch_size": 64,
                                                      "tenacity": 5, "epoch_size": 4}})

    def batcher(_params, batch):  # SimCSE's batcher joins each token list with single spaces
        return np.stack([lookup(" ".join(tokens)) for tokens in batch])

    return evaluation.run(params, batcher)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", required=True, help="SentEval's data/downstream folder (or data/)")
    parser.add_argument("--senteval_path", default=None, help="folder holding SentEval's senteval package")
    parser.add_argument("--output", required=True, help="JSON file the results are merged into")
    parser.add_argument("--cache", default=None, help="embedding cache (.pt); default: beside --output")
    parser.add_argument("--tasks", default="mr,cr,subj,mpqa,sst2,trec,mrpc")
    parser.add_argument("--side", choices=["both", "ours", "senteval"], default="both")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=64, help="encoding batch size")
    parser.add_argument("--seed", type=int, default=1111)
    args = parser.parse_args()

    import numpy as np
    import torch

    from harness.transfer import evaluate_transfer, find_downstream

    threads = set_threads(args.threads)
    info = machine(threads)
    print_machine(info)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    root = find_downstream(args.data_dir, tasks)
    if args.side != "ours" and not args.senteval_path:
        parser.error("--senteval_path is needed for SentEval's side")
    cache_path = args.cache or os.path.splitext(args.output)[0] + ".embeddings.pt"
    cache = cached_embeddings(cache_path, task_sentences(root, tasks), args.batch_size)
    row = {s: i for i, s in enumerate(cache["sentences"])}
    matrix = cache["embeddings"]
    array = matrix.numpy()

    def encode(sentences: list[str]) -> torch.Tensor:
        return matrix[torch.tensor([row[s] for s in sentences], dtype=torch.long)]

    report = json.load(open(args.output)) if os.path.exists(args.output) else {}
    report.setdefault("machine", info)
    report.setdefault("model", MODEL)
    tasks_out = report.setdefault("tasks", {})
    sides = ["senteval", "ours"] if args.side == "both" else [args.side]
    for task in tasks:
        for side in sides:
            if side in tasks_out.get(task, {}):
                print(f"{task} {side}: already in {args.output}, skipped")
                continue
            start, cpu_start = time.perf_counter(), time.process_time()
            if side == "ours":
                res = evaluate_transfer(encode, root, tasks=[task], seed=args.seed, progress=None)
                out = {"acc": res[task], "devacc": res["transfer_details"][task]["devacc"]}
                if task == "mrpc":
                    out["f1"] = res["mrpc_f1"]
            else:
                res = run_senteval(task, root, lambda s: array[row[s]], args.senteval_path, args.seed)
                out = {k: float(res[k]) for k in ("acc", "devacc", "f1") if k in res}
            out["seconds"] = round(time.perf_counter() - start, 1)
            # on a shared machine CPU seconds (one thread: no waiting for a core counted) are the steadier figure
            out["cpu_seconds"] = round(time.process_time() - cpu_start, 1)
            out["threads"], out["date"] = threads, time.strftime("%Y-%m-%d", time.gmtime())
            tasks_out.setdefault(task, {})[side] = out
            print(f"{task} {side}: {json.dumps(out)}", flush=True)
            with open(args.output + ".tmp", "w") as f:
                json.dump(report, f, indent=1)
            os.replace(args.output + ".tmp", args.output)

    print("| task | SentEval acc | ours acc | diff | SentEval s (CPU s) | ours s (CPU s) | speed-up (CPU) |")
    print("|---|---|---|---|---|---|---|")
    done = [t for t in tasks_out if {"ours", "senteval"} <= set(tasks_out[t])]
    for task in done:
        a, b = tasks_out[task]["senteval"], tasks_out[task]["ours"]
        extra = f" (F1 {a['f1']:.2f} / {b['f1']:.2f})" if "f1" in a else ""
        cpu = (f"{a['cpu_seconds'] / b['cpu_seconds']:.1f}x" if a.get("cpu_seconds") and b.get("cpu_seconds")
               else "-")
        print(f"| {task.upper()}{extra} | {a['acc']:.2f} | {b['acc']:.2f} | {b['acc'] - a['acc']:+.2f} | "
              f"{a['seconds']:.0f} ({a.get('cpu_seconds', '-')}) | {b['seconds']:.1f} ({b.get('cpu_seconds', '-')}) | "
              f"{a['seconds'] / b['seconds']:.1f}x ({cpu}) |")
    if len(done) == 7:
        sa = np.mean([tasks_out[t]["senteval"]["acc"] for t in done])
        so = np.mean([tasks_out[t]["ours"]["acc"] for t in done])
        print(f"| avg | {sa:.2f} | {so:.2f} | {so - sa:+.2f} | | | |")


if __name__ == "__main__":
    main()
