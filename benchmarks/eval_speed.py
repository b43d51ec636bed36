"""How fast is evaluation against the reference implementations, with the same figures? Both, in one run.

1. **STS**: the seven tasks of the offline all-MiniLM-L6-v2 in fp32 on the torch threads given (default: every
   core): ours (``harness.sts_eval.evaluate_sts``: each distinct sentence once, batched by length) against the
   pair-by-pair way (``plain_sts`` below: each subset's pairs encoded as they come), in turns; the
   seconds of each (the evaluation alone, the model loaded) and the seven-task average of each.
2. **Transfer**: SentEval's own task classes (``MREval`` ... ``MRPCEval``, ``run(params, batcher)``) against ours
   (``harness.transfer.evaluate_transfer``) on the same cached embeddings (the offline all-MiniLM-L6-v2, fp32,
   computed once), with SimCSE's ``--mode test`` classifier (``kfold 10``, logistic regression, Adam, batch 64,
   tenacity 5, epoch size 4), task by task, one side after the other on the same threads: seconds, CPU seconds
   and test accuracy (MRPC's F1 too) of each, so any difference comes from the classifiers alone.

SentEval's code is not part of this project: give the folder that holds its ``senteval`` package (a clone of
facebookresearch/SentEval) with ``--senteval_path``. Its classifier moves its tensors to CUDA (``.cuda()`` and
``.to(torch.device('cuda'))``), made the CPU here so it runs on any machine, and its ``utils`` calls
``inspect.getargspec``, which Python 3.11 removed: it gets ``inspect.getfullargspec``, whose first field is the same
list of argument names.

    python benchmarks/eval_speed.py --sts_dir $SENTEMB_DATA/sts --transfer_dir $SENTEMB_DATA/senteval \\
        --senteval_path ../SentEval [--parts sts,transfer] [--tasks mr,cr,...] [--threads N]

SentEval's side of the seven transfer tasks takes more than an hour of a core. Each finished part (STS, each
task's side) is kept in ``--state`` (default ``runs/bench/eval_speed.json``) and skipped by a rerun, so a stopped
run resumes; when every part asked for is done, the run's record is written (``results/benchmarks/eval_speed/``)
and the state file is removed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

from common import ROOT, alternate, machine, print_machine, set_threads, write_record  # noqa: I001 (sets sys.path)

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

    import inspect

    if senteval_path not in sys.path:
        sys.path.insert(0, senteval_path)
    if not hasattr(inspect, "getargspec"):  # removed in Python 3.11; SentEval's utils reads field 0, the args
        inspect.getargspec = inspect.getfullargspec
    # SentEval's classifier moves everything with .cuda() and .to(torch.device('cuda')); on a CPU machine both
    # become the CPU: .cuda() the identity, and the classifier module sees a torch whose device('cuda') is the CPU.
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    classifier = importlib.import_module("senteval.tools.classifier")
    on_cpu = types.ModuleType("torch_on_cpu")
    on_cpu.__dict__.update(torch.__dict__)
    on_cpu.device = lambda kind, *a, **k: (torch.device("cpu") if str(kind).startswith("cuda")
                                           else torch.device(kind, *a, **k))
    classifier.torch = on_cpu
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


def plain_sts(encode, sts_dir: str) -> dict:
    """The STS evaluation pair by pair, without encoding each distinct sentence once: every subset's pairs encoded
    as they come (``encode(s1 + s2)``), Spearman and SentEval's "all" as ``harness.sts_eval`` computes them."""
    import numpy as np
    import torch.nn.functional as F

    from datamodules import STS_TASKS, load_sts_task
    from harness.sts_eval import aggregate_all, senteval_text

    results = {}
    for task in STS_TASKS:
        subsets = {}
        for subset, pairs in load_sts_task(sts_dir, task).items():
            s1 = [senteval_text(s) for s in pairs["sentence1"]]
            s2 = [senteval_text(s) for s in pairs["sentence2"]]
            emb = encode(s1 + s2).float()
            cos = F.cosine_similarity(emb[: len(s1)], emb[len(s1):], dim=-1).numpy()
            subsets[subset] = (cos, np.asarray(pairs["score"], dtype=np.float64))
        results[task] = aggregate_all(subsets)["all"]
    results["avg"] = float(np.mean([results[t] for t in STS_TASKS]))
    return results


def sts_part(args, threads: int) -> dict:
    from encoders.sentence import SentenceEncoder
    from harness.sts_eval import evaluate_sts

    encoder = SentenceEncoder(MODEL).eval()
    encode = lambda s: encoder.encode(s, batch_size=args.batch_size)  # noqa: E731  (fp32)
    encode(["a warm-up sentence"] * 8)
    found = {}
    programs = {"ours": lambda: found.__setitem__("ours", evaluate_sts(encode, args.sts_dir)),
                "plain": lambda: found.__setitem__("plain", plain_sts(encode, args.sts_dir))}
    timings = alternate(programs, args.reps)
    import statistics

    out = {f"sts_{name}_s": round(statistics.median(timings.wall[name]), 1) for name in programs}
    out.update({f"sts_{name}_avg": round(found[name]["avg"], 4) for name in programs})
    out["sts_plain_over_ours"] = round(statistics.median(p / o for p, o in zip(timings.wall["plain"],
                                                                                timings.wall["ours"])), 2)
    print(f"STS, seven tasks, fp32, {threads} thread(s): ours {out['sts_ours_s']} s (avg {out['sts_ours_avg']:.2f}), "
          f"pair by pair {out['sts_plain_s']} s (avg {out['sts_plain_avg']:.2f}): {out['sts_plain_over_ours']}x",
          flush=True)
    return out


def transfer_part(args, task: str, side: str, lookup) -> dict:
    from harness.transfer import evaluate_transfer

    start, cpu_start = time.perf_counter(), time.process_time()
    if side == "ours":
        res = evaluate_transfer(lookup["encode"], lookup["root"], tasks=[task], seed=args.seed, progress=None)
        out = {"acc": res[task], "devacc": res["transfer_details"][task]["devacc"]}
        if task == "mrpc":
            out["f1"] = res["mrpc_f1"]
    else:
        res = run_senteval(task, lookup["root"], lookup["row"], args.senteval_path, args.seed)
        out = {k: round(float(res[k]), 2) for k in ("acc", "devacc", "f1") if k in res}
    out["s"] = round(time.perf_counter() - start, 1)
    out["cpu_s"] = round(time.process_time() - cpu_start, 1)
    print(f"{task} {side}: {json.dumps(out)}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sts_dir", default=None, help="the seven STS tasks (the data root's sts/)")
    parser.add_argument("--transfer_dir", default=None, help="SentEval's transfer tasks (the data root's senteval/)")
    parser.add_argument("--senteval_path", default=None, help="folder holding SentEval's senteval package")
    parser.add_argument("--parts", default="sts,transfer", help="sts, transfer or both")
    parser.add_argument("--tasks", default="mr,cr,subj,mpqa,sst2,trec,mrpc")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    parser.add_argument("--reps", type=int, default=2, help="STS: timed repetitions of each side, in turns")
    parser.add_argument("--batch_size", type=int, default=64, help="encoding batch size")
    parser.add_argument("--seed", type=int, default=1111)
    parser.add_argument("--state", default=str(ROOT / "runs" / "bench" / "eval_speed.json"))
    parser.add_argument("--cache", default=None, help="embedding cache of the transfer tasks (default: beside --state)")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if "sts" in parts and not args.sts_dir:
        parser.error("--sts_dir is needed for the STS part")
    if "transfer" in parts and not (args.transfer_dir and args.senteval_path):
        parser.error("--transfer_dir and --senteval_path are needed for the transfer part")

    import torch

    threads = set_threads(args.threads)
    info = machine(threads)
    print_machine(info)
    state = json.load(open(args.state)) if os.path.exists(args.state) else {"figures": {}}
    os.makedirs(os.path.dirname(args.state) or ".", exist_ok=True)

    def save() -> None:
        with open(args.state + ".tmp", "w") as f:
            json.dump(state, f, indent=1)
        os.replace(args.state + ".tmp", args.state)

    figures = state["figures"]
    if "sts" in parts and "sts_ours_s" not in figures:
        figures.update(sts_part(args, threads))
        save()
    if "transfer" in parts:
        from harness.transfer import find_downstream

        root = find_downstream(args.transfer_dir, tasks)
        cache = cached_embeddings(args.cache or os.path.splitext(args.state)[0] + ".embeddings.pt",
                                  task_sentences(root, tasks), args.batch_size)
        row = {s: i for i, s in enumerate(cache["sentences"])}
        matrix = cache["embeddings"]
        array = matrix.numpy()
        lookup = {"root": root, "row": lambda s: array[row[s]],
                  "encode": lambda sentences: matrix[torch.tensor([row[s] for s in sentences], dtype=torch.long)]}
        for task in tasks:
            for side in ("senteval", "ours"):
                if f"{task}_{side}_s" in figures:
                    continue
                out = transfer_part(args, task, side, lookup)
                figures.update({f"{task}_{side}_{k}": v for k, v in out.items()})
                save()
        print("| task | SentEval acc | ours acc | SentEval s (CPU s) | ours s (CPU s) | SentEval / ours |")
        print("|---|---|---|---|---|---|")
        for task in tasks:
            a = {k.split("_", 2)[2]: v for k, v in figures.items() if k.startswith(f"{task}_senteval_")}
            b = {k.split("_", 2)[2]: v for k, v in figures.items() if k.startswith(f"{task}_ours_")}
            figures[f"{task}_speedup"] = round(a["s"] / b["s"], 2)
            print(f"| {task.upper()} | {a['acc']:.2f} | {b['acc']:.2f} | {a['s']} ({a['cpu_s']}) | {b['s']} "
                  f"({b['cpu_s']}) | {figures[f'{task}_speedup']}x |")
        total_a = sum(figures[f"{t}_senteval_s"] for t in tasks)
        total_b = sum(figures[f"{t}_ours_s"] for t in tasks)
        figures["transfer_senteval_s"], figures["transfer_ours_s"] = round(total_a, 1), round(total_b, 1)
        figures["transfer_speedup"] = round(total_a / total_b, 2)
        print(f"all {len(tasks)} tasks: SentEval {total_a:.0f} s, ours {total_b:.0f} s: {figures['transfer_speedup']}x")
    write_record("eval_speed", figures, threads, notes={"parts": parts, "tasks": tasks, "model": MODEL})
    os.remove(args.state)


if __name__ == "__main__":
    main()
