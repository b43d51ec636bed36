"""The speed blocks: README's table and first commands, and docs/PERFORMANCE.md's, from the benchmark records
(``results/benchmarks/<name>/<date>-<processor>.json``, written by ``benchmarks/``).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tables import Data, bench_header, command_of, newest, processor  # noqa: E402

from harness.figures import figure  # noqa: E402


def speed_rows(bench: list[dict]) -> list[tuple[str, str, dict]]:
    """(figure, value, record) of the newest record of each benchmark: the README's speed table."""
    rows = []
    train = newest(bench, "train_throughput_padding_free")
    if train:
        f = train["figures"]
        precision = {"32": "fp32", "bf16": "bf16 autocast"}.get(str(train["notes"].get("precision")),
                                                                  train["notes"].get("precision"))
        rows.append((f"MNR training step, ours / sentence-transformers, identical batches ({precision})",
                     f"**{f['identical batches/ours / identical batches/theirs ratio']:.2f}x**", train))
        rows.append((f"MNR training step, padding-free / padded, same batches ({precision})",
                     f"**{f['identical batches/ours / identical batches/ours, padded ratio']:.2f}x**", train))
    evals = newest(bench, "eval_speed")
    if evals and "sts_ours_s" in evals["figures"]:
        f = evals["figures"]
        rows.append(("STS evaluation, the seven tasks of all-MiniLM-L6-v2 in fp32, each distinct sentence once / "
                     "each pair as it comes",
                     f"**{f['sts_ours_s']:.0f} s** / {f['sts_plain_s']:.0f} s (averages {figure(f['sts_ours_avg'])} / "
                     f"{figure(f['sts_plain_avg'])})", evals))
    if evals and "transfer_speedup" in evals["figures"]:
        f = evals["figures"]
        tasks = evals["notes"].get("tasks", [])
        low = min(f[f"{t}_speedup"] for t in tasks)
        rows.append(("transfer tasks, SentEval's own code / ours, same embeddings",
                     f"**{f['transfer_speedup']:.1f}x** over the {len(tasks)} tasks "
                     f"({low:.1f}x on the task it gains least on)", evals))
    scaling = newest(bench, "scaling")
    if scaling and "processes efficiency" in scaling["figures"]:
        rows.append(("CPU DDP, 2 processes against 1 (sentences/s over twice one's)",
                     f"{scaling['figures']['processes efficiency']:.0%}", scaling))
    return rows


def readme_first_commands(data: Data) -> str:
    """The two commands' time and disk, from the newest ``benchmarks/first_commands.py`` record."""
    record = newest(data.bench, "first_commands")
    if record is None:
        return "Their time and disk: no record yet (`python benchmarks/first_commands.py --tests` writes it)."
    f = record["figures"]
    load = f"load average {f['load_start']:.1f} at the start, {f['load_end']:.1f} at the end"
    tests = (f"`make test` ran its {f['tests_passed']:.0f} tests in {f['tests_s'] / 60:.0f} minutes"
             if "tests_s" in f else "`make test` has no timed record yet (`python benchmarks/first_commands.py "
             "--tests`; `.ci/run` prints the suite's time)")
    return (f"On {processor(record)}, {record['date']} ({load}): `make quickstart` took {f['quickstart_s']:.0f} s and "
            f"left a {f['quickstart_mb']:.0f} MB run directory (the checkpoint with its optimizer state, logs, config; "
            f"`make clean` removes it); {tests}. From {command_of(record)}.")


def readme_speed(data: Data) -> str:
    bench = data.bench
    rows = speed_rows(bench)
    if not rows:
        return "No benchmark has a record yet."
    lines = ["| figure | value | processor, date | command |", "|---|---|---|---|"]
    for what, value, record in rows:
        lines.append(f"| {what} | {value} | {processor(record)}; {record['date']} | {command_of(record)} |")
    families = sorted({processor(r).split(" (")[0] + (" with " + ", ".join(r["machine"]["bf16_units"])
                                                       if r["machine"].get("bf16_units") else " without bf16 units")
                       for r in {id(r): r for _, _, r in rows}.values()})
    lines.append("")
    lines.append(f"Processor families with a record: {'; '.join(families)}. A family not listed has no record of "
                 "these figures: the ratios are not carried over from one family to another.")
    return "\n".join(lines)


def perf_train(data: Data) -> str:
    record = newest(data.bench, "train_throughput_padding_free")
    if record is None:
        return "No record yet."
    f = record["figures"]
    notes = record["notes"]
    lines = [bench_header(record, f"batch {notes.get('batch_size')}, max length {notes.get('max_length')}, "
                                  f"{notes.get('steps')} timed steps, median of {notes.get('reps')} repetitions"), "",
             "| program | steps/s | real tokens of the batches |", "|---|---|---|"]
    for program in ("identical batches/ours", "identical batches/ours, padded", "identical batches/theirs"):
        share = f.get(f"{program} real token share")
        lines.append(f"| {program.split('/')[1]} | {f[f'{program} steps/s']:.3f} | "
                     f"{'' if share is None else f'{share:.0%}'} |")
    lines += ["", "| ratio | value |", "|---|---|"]
    for key, value in f.items():
        if key.endswith(" ratio"):
            lines.append(f"| {key.removesuffix(' ratio').replace('identical batches/', '')} | **{value:.2f}x** |")
    return "\n".join(lines)


def perf_profile(data: Data) -> str:
    record = newest(data.bench, "profile_train")
    if record is None:
        return "No record yet."
    f = record["figures"]
    sides = [s for s in ("ours", "theirs") if f"{s} steps/s" in f]
    cats = [k.split(" ", 1)[1].removesuffix(" ms") for k in f if k.startswith(sides[0] + " ") and k.endswith(" ms")]
    layers = record["notes"].get("layers", 6)
    notes = record["notes"]
    lines = [bench_header(record, f"batch {notes.get('batch_size')}, max length {notes.get('max_length')}; self CPU "
                                  f"time per step of each group of operators over {notes.get('steps')} steps"), "",
             "| operators | " + " | ".join(f"{s}: ms/step (ms/layer)" for s in sides) + " |",
             "|---|" + "---|" * len(sides)]
    for cat in cats:
        lines.append(f"| {cat} | " + " | ".join(f"{f[f'{s} {cat} ms']:.0f} ({f[f'{s} {cat} ms'] / layers:.1f})"
                                                 for s in sides) + " |")
    totals = {s: sum(f[f"{s} {c} ms"] for c in cats) for s in sides}
    lines.append("| all | " + " | ".join(f"{totals[s]:.0f}" for s in sides) + " |")
    return "\n".join(lines)


def perf_eval(data: Data) -> str:
    record = newest(data.bench, "eval_speed")
    if record is None:
        return "No record yet."
    f = record["figures"]
    lines = [bench_header(record), ""]
    if "sts_ours_s" in f:
        lines += ["| STS, seven tasks, fp32 | seconds | seven-task average |", "|---|---|---|",
                  f"| ours: each distinct sentence once, by length | **{f['sts_ours_s']:.1f}** | "
                  f"{figure(f['sts_ours_avg'])} |",
                  f"| pair by pair: each subset's pairs as they come | {f['sts_plain_s']:.1f} | {figure(f['sts_plain_avg'])} |",
                  ""]
    tasks = record["notes"].get("tasks", [])
    if "transfer_speedup" in f:
        lines += ["| transfer task | SentEval: test acc (dev acc) | ours: test acc (dev acc) | SentEval s | ours s | "
                  "SentEval / ours |", "|---|---|---|---|---|---|"]

        def scores(task: str, side: str) -> str:
            text = f"{figure(f[f'{task}_{side}_acc'])} (dev {figure(f[f'{task}_{side}_devacc'])})"
            return text + (f", F1 {figure(f[f'{task}_{side}_f1'])}" if f"{task}_{side}_f1" in f else "")

        for t in tasks:
            acc = f"{scores(t, 'senteval')} | {scores(t, 'ours')}"
            lines.append(f"| {t.upper()} | {acc} | {f[f'{t}_senteval_s']:.0f} | {f[f'{t}_ours_s']:.1f} | "
                         f"**{f[f'{t}_speedup']:.1f}x** |")
        lines.append(f"| all | | | {f['transfer_senteval_s']:.0f} | {f['transfer_ours_s']:.0f} | "
                     f"**{f['transfer_speedup']:.1f}x** |")
    return "\n".join(lines)


def perf_scaling(data: Data) -> str:
    record = newest(data.bench, "scaling")
    if record is None:
        return "No record yet."
    f = record["figures"]
    lines = [bench_header(record, f"{record['notes'].get('steps')} timed steps a point, each point in a fresh "
                                  "process (peak memory is its resident set)"), "",
             "| work | step (s) | sentences/s | peak memory (MiB) | step per unit, against the first point |",
             "|---|---|---|---|---|"]
    first: dict[str, float] = {}  # step time per token (length) or per sentence (batch) at each sweep's first point
    sweeps = ("length", "batch", "processes")  # each sweep from its smallest point: the record's keys are sorted as text
    points = sorted((k.removesuffix(" step_s") for k in f if k.endswith(" step_s")),
                    key=lambda k: (sweeps.index(k.split()[0]) if k.split()[0] in sweeps else len(sweeps),
                                   int(k.split()[1]) if k.split()[1].isdigit() else 0, k))
    for key in points:
        label = key.replace("length ", "max length ")
        sweep, size = key.split()[0], key.split()[1]
        if sweep == "batch" and int(size) >= record["notes"].get("grad_cache_from", 10 ** 9):
            mini = record["notes"].get("grad_cache_mini_batch")
            label += f" (GradCache, {mini} at a time)" if mini else " (GradCache)"
        unit = ""
        if sweep in ("length", "batch") and size.isdigit():
            per = f[key + " step_s"] / int(size)
            first.setdefault(sweep, per)
            unit = f"{per / first[sweep]:.2f}x per {'token' if sweep == 'length' else 'sentence'}"
        lines.append(f"| {label} | {f[key + ' step_s']:.2f} | {f[key + ' sentences_per_s']:.1f} | "
                     f"{f[key + ' peak_mib']:.0f} | {unit} |")
    for key in [k for k in f if k.endswith(" failed")]:
        lines.append(f"| {key.removesuffix(' failed')} | did not run: {f[key]} | | | |")
    if "processes efficiency" in f:
        lines.append(f"| 2 processes against 1: scaling efficiency | | **{f['processes efficiency']:.0%}** | | |")
    if "tokenization seconds" in f:
        lines.append(f"| first tokenization of {f['tokenization lines']:,.0f} lines | "
                     f"{f['tokenization seconds']:.0f} (the whole) | {f['tokenization lines'] / f['tokenization seconds']:,.0f}"
                     f" lines/s | {f['tokenization peak_mib']:.0f} | |")
    return "\n".join(lines)
