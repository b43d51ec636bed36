"""Every results table of the docs, written from the records: one command, and a check that nothing drifted.

    python experiments/report.py            # rewrite every generated block and file from results/
    python experiments/report.py --check    # change nothing; exit 1 naming each block that differs

A generated block sits in a markdown page between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``; the
text between the markers is this script's, and a hand edit there is undone by the next run (and fails
``--check``). Prose outside the blocks quotes no figure: the findings are generated blocks too. Each block is
a function below, of the records alone (``experiments/records.py``); statistics come from
``experiments/stats.py``, paper figures from ``experiments/papers.py``. ``docs/results/cells.csv`` (every
record, one line each) and the plots (``experiments/svg_chart.py``: SVG text) are written the same way.
"""
from __future__ import annotations

import argparse
import csv
import difflib
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402
import stats  # noqa: E402
import svg_chart  # noqa: E402
from objectives import LRS, choose  # noqa: E402
from papers import PAPERS, SBERT_STSB, PaperRow  # noqa: E402
from records import DEV, ROOT, STS  # noqa: E402

from harness.figures import figure  # noqa: E402  (the one rounding rule: evaluate.py prints with it too)
from harness.measurement import in_clone  # noqa: E402

BLOCK = re.compile(r"(<!-- report:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /report:(?P=name) -->)", re.S)
PAGES = ("README.md", "docs/RESULTS.md", "docs/results/objectives.md", "docs/results/simcse_dclr.md",
         "docs/PERFORMANCE.md", "docs/EVALUATION.md", "docs/FILM.md")
NAMES = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
         "stsb": "STS-B", "sickr": "SICK-R", "avg": "avg"}


@dataclass(frozen=True)
class Row:
    """One objective of the front page: its name, its studies' stem, its paper's pooling, its paper figure."""
    label: str
    stem: str  # records: objectives_dev_<stem> (the dev grid) and objectives_<stem> (the choice on test)
    pooling: str
    paper: PaperRow | None
    budget: str = "lr"  # "lr": the learning-rate grid; "shipped": one cell, the config as shipped
    start: str = "start_mean"


OBJECTIVES = (
    Row("SBERT NLI softmax", "nli_softmax", "mean", PAPERS["sbert_nli"].paper_row),
    Row("SBERT STS-B regression", "sts_regression", "mean", SBERT_STSB),
    Row("SBERT triplet (NLI)", "triplet", "mean", None),
    Row("MNR, NLI pairs", "mnr", "mean", None),
    Row("MNR, NLI pairs + their contradiction (1 hard negative)", "mnr_hard_negatives", "mean", None),
    Row("MNR, NLI pairs + 3 mined negatives (relative margin 0.05)", "mnr_mined", "mean", None),
    Row("MNR, NLI pairs, Matryoshka dimensions (scored at 384)", "mnr_matryoshka", "mean", None),
    Row("supervised SimCSE (batch 64)", "simcse_sup", "cls + MLP", PAPERS["simcse_sup"].paper_row,
        start="start_cls_before_pooler"),
    Row("unsupervised SimCSE", "simcse_unsup", "cls (MLP in training)", PAPERS["simcse_unsup"].paper_row,
        start="start_cls_before_pooler"),
    Row("DCLR, paper form (complementary: the chosen SimCSE)", "dclr", "cls (MLP in training)",
        PAPERS["dclr_bert_base"].paper_row, start="start_cls_before_pooler"),
    Row("FILM over TF-IDF", "film_tfidf", "TF-IDF", None, budget="shipped"),
    Row("FILM over frozen all-MiniLM-L6-v2", "film_frozen_encoder", "mean, frozen", None, budget="shipped"),
    Row("FILM deep: triplet on a head over a frozen transformer", "film_deep_triplet", "mean, frozen + head", None,
        budget="shipped"),
)


# -- reading the records -------------------------------------------------------------------------------------
def dev_mean(record: dict) -> float:
    return (record["dev"]["stsb"] + record["dev"]["sickr"]) / 2


def lr_of(record: dict) -> str:
    return record["values"]["model.init_args.lr"]


def test_records(found: list[dict]) -> list[dict]:
    return [r for r in found if r["test"] is not None]


def fmt(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "—"
    return figure(value, sign=sign)


def where(found: list[dict]) -> str:
    """Machines, precisions and dates of a set of records, in words."""
    machines = sorted({machine_text(r) for r in found})
    precisions = sorted({f"trained: train {r['precision']['train']}, eval {r['precision']['eval']}"
                         if r["precision"].get("train") is not None else f"eval only: eval {r['precision']['eval']}"
                         for r in found})  # an evaluation-only record (the start model) trained nothing
    dates = sorted({r["date"] for r in found})
    torch = sorted({r["versions"].get("torch") or "?" for r in found})
    return (f"{'; '.join(machines)}; torch {', '.join(torch)}; {'; '.join(precisions)}; "
            f"{dates[0] if len(dates) == 1 else dates[0] + ' to ' + dates[-1]}")


def machine_text(record: dict) -> str:
    m = record["machine"]
    if m.get("gpu"):
        return f"one {m['gpu']}"
    units = ", ".join(m.get("bf16_units") or []) or "no bf16 units"
    return f"{m['cores']} cores of an {m['cpu']} ({units}), {m['threads']} thread(s) a cell"


# -- the blocks -----------------------------------------------------------------------------------------------
def front_table(all_records: list[dict]) -> str:
    lines = ["| objective | pooling | dev budget | chosen | seeds | test avg | Δ start | STS-B | SICK-R | paper |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in OBJECTIVES:
        start = records.select(all_records, row.start)
        start_avg = start[0]["test"]["avg"] if start else None
        if row.budget == "lr":
            dev = records.select(all_records, f"objectives_dev_{row.stem}")
            chosen = choose(dev)
            budget = f"{len(dev)} of {len(LRS)} cells" if chosen is None else f"{len(LRS)} cells (lr)"
            pick = f"lr {lr_of(chosen)}" if chosen else "—"
            tests = test_records(records.select(all_records, f"objectives_{row.stem}"))
        else:
            budget, pick = "1 cell", "as shipped"
            tests = test_records(records.select(all_records, row.stem))
        avg = stats.summary([r["test"]["avg"] for r in tests])
        delta = fmt(avg.mean - start_avg, sign=True) if avg.n and start_avg is not None else "—"
        seeds = ", ".join(str(r["seed"]) for r in tests) or "—"
        cells = [row.label, row.pooling, budget, pick, seeds, avg.text(), delta,
                 stats.summary([r["test"]["stsb"] for r in tests]).text(),
                 stats.summary([r["test"]["sickr"] for r in tests]).text(), paper_text(row.paper)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paper_text(row: PaperRow | None) -> str:
    if row is None:
        return "no paper figure on these tasks"
    metric = "avg" if "avg" in row.scores else next(iter(row.scores))
    what = "seven-task avg" if metric == "avg" else f"{NAMES[metric]} only (no seven-task avg)"
    return f"{figure(row.scores[metric])}, {what} ({row.row}; {row.citation})"


def start_table(all_records: list[dict]) -> str:
    lines = ["| start | " + " | ".join(NAMES[t] for t in (*STS, "avg")) + " |", "|---" * (len(STS) + 2) + "|"]
    for study, label in (("start_mean", "all-MiniLM-L6-v2, mean pooling"),
                         ("start_cls_before_pooler", "all-MiniLM-L6-v2, first token's state (the cls regime)")):
        for r in records.select(all_records, study):
            lines.append(f"| {label} | " + " | ".join(fmt(r["test"][t]) for t in (*STS, "avg")) + " |")
    return "\n".join(lines)


def at_the_edge(label: str, chosen: dict | None, knobs: dict[str, tuple[str, ...]]) -> list[str]:
    """Where a dev choice sits on the border of what was searched, so that its optimum may lie outside: a numeric
    knob at its grid's smallest or largest value, or the best checkpoint at the run's last dev evaluation."""
    if chosen is None:
        return []
    found = []
    for key, grid in knobs.items():
        value = chosen["values"].get(key)
        if len(grid) > 1 and value in grid:
            ordered = sorted(grid, key=float)
            if value in (ordered[0], ordered[-1]):
                end = "smallest" if value == ordered[0] else "largest"
                found.append(f"{label}, {key.rsplit('.', 1)[-1]} {value} (the {end} searched)")
    last = max(point["step"] for point in chosen["dev_curve"])
    if last and chosen["selection"]["step"] == last:
        found.append(f"{label}, its best checkpoint at the last dev evaluation (step {last})")
    return found


def edge_paragraph(found: list[str]) -> list[str]:
    return ["", "Choices on the edge of their search, whose optimum may lie outside it: " + "; ".join(found) + "."] \
        if found else []


def dev_grids(all_records: list[dict]) -> str:
    lines = ["| objective | lr | best step | STS-B dev | SICK-R dev | dev mean | chosen |", "|---|---|---|---|---|---|---|"]
    edges = []
    for row in OBJECTIVES:
        if row.budget != "lr":
            continue
        dev = records.select(all_records, f"objectives_dev_{row.stem}")
        chosen = choose(dev)
        edges += at_the_edge(row.label, chosen, {"model.init_args.lr": LRS})
        for r in sorted(dev, key=lambda r: LRS.index(lr_of(r))):
            mark = "**yes**" if chosen is not None and r is chosen else ""
            lines.append(f"| {row.label} | {lr_of(r)} | {r['selection']['step']} | {fmt(r['dev']['stsb'])} | "
                         f"{fmt(r['dev']['sickr'])} | {fmt(dev_mean(r))} | {mark} |")
    return "\n".join(lines + edge_paragraph(edges))


def test_table(all_records: list[dict]) -> str:
    tasks = (*STS, "avg")
    lines = ["| objective | seeds | " + " | ".join(NAMES[t] for t in tasks) + " |", "|---" * (len(tasks) + 2) + "|"]
    for row in OBJECTIVES:
        study = f"objectives_{row.stem}" if row.budget == "lr" else row.stem
        tests = test_records(records.select(all_records, study))
        if not tests:
            continue
        lines.append(f"| {row.label} | {', '.join(str(r['seed']) for r in tests)} | " +
                     " | ".join(stats.summary([r["test"][t] for r in tests]).text() for t in tasks) + " |")
    return "\n".join(lines)


def per_seed_table(all_records: list[dict]) -> str:
    lines = ["| objective | seed | batch order | best step | dev mean | test avg | wall (s) |", "|---|---|---|---|---|---|---|"]
    for row in OBJECTIVES:
        study = f"objectives_{row.stem}" if row.budget == "lr" else row.stem
        for r in test_records(records.select(all_records, study)):
            mean = fmt(dev_mean(r)) if set(DEV) <= set(r["dev"]) else "—"
            lines.append(f"| {row.label} | {r['seed']} | {r['data_seed']} | {r['selection']['step'] or 'last'} | "
                         f"{mean} | {fmt(r['test']['avg'])} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def objectives_where(all_records: list[dict]) -> str:
    found = [r for r in all_records if r["study"].startswith(("objectives_", "start_", "film_"))]
    return f"Where and when: {where(found)}." if found else "No cell of this study has finished yet."


def test_avgs(data: list[dict], study: str) -> dict[int, float]:
    """Seed -> seven-task test average of a study's records that scored the test tasks."""
    return {r["seed"]: r["test"]["avg"] for r in test_records(records.select(data, study))}


def front_findings(all_records: list[dict]) -> str:
    """The front table in sentences: which objectives raise the start, which lower it, and which move it less than
    their seeds vary (the 95 % interval of the mean difference from the start holds 0)."""
    start = records.select(all_records, "start_mean")
    if not start:
        return "The start model's record is missing; no finding yet."
    base = start[0]["test"]["avg"]
    groups: dict[str, list[str]] = {"up": [], "down": [], "noise": [], "one": []}
    for row in OBJECTIVES:
        if row.start != "start_mean":
            continue
        study = f"objectives_{row.stem}" if row.budget == "lr" else row.stem
        tests = test_avgs(all_records, study)
        if len(tests) == 1:
            groups["one"].append(f"{row.label} {next(iter(tests.values())) - base:+.2f}")
        elif tests:
            d = stats.paired({seed: base for seed in tests}, tests)  # against the start, a constant
            where = "up" if d.low > 0 else "down" if d.high < 0 else "noise"
            groups[where].append(f"{row.label} {d.mean:+.2f} (95 % interval {d.low:+.2f} to {d.high:+.2f})")
    if not any(groups.values()):
        return "No objective has finished its test cells yet."
    sentences = [text + "; ".join(groups[key]) + "." for key, text in (
        ("up", "these raise the seven-task average: "), ("down", "these lower it: "),
        ("noise", "these move it less than their seeds vary: "), ("one", "one seed so far: ")) if groups[key]]
    sentences[1:] = [s[0].upper() + s[1:] for s in sentences[1:]]
    return f"From the mean-pooled start ({figure(base)}), over each choice's seeds, " + " ".join(sentences)


# -- the speed figures: records of benchmarks/ (results/benchmarks/<name>/<date>-<processor>.json) -----------------
BENCHMARK_FIELDS = ("benchmark", "command", "machine", "versions", "commit", "date", "figures", "notes")


def benchmark_records(root: Path) -> list[dict]:
    """Every benchmark record under ``root/benchmarks``, checked, oldest first."""
    import json

    found = []
    for path in sorted((root / "benchmarks").glob("*/*.json")):
        record = json.loads(path.read_text())
        missing = [k for k in BENCHMARK_FIELDS if k not in record]
        if missing:
            raise records.RecordError(f"{path}: missing field {missing[0]!r}")
        # a day's later runs on one processor are <date>-<processor>-2.json, -3 ... (harness.measurement.write_record)
        later = re.fullmatch(r"(.+)-(\d+)", path.stem)
        n = int(later.group(2)) if later and path.with_name(later.group(1) + ".json").exists() else 1
        found.append((record["date"], n, record))
    return [r for *_, r in sorted(found, key=lambda f: f[:2])]


def newest(bench: list[dict], name: str) -> dict | None:
    mine = [r for r in bench if r["benchmark"] == name]
    return mine[-1] if mine else None


def processor(record: dict) -> str:
    m = record["machine"]
    if m.get("gpu"):
        return f"one {m['gpu']}"
    units = ", ".join(m.get("bf16_units") or []) or "no bf16 units (AVX2)"
    return f"{m['cpu']} ({units}), {m['threads']} thread(s) of {m['cores']} cores"


def command_of(record: dict) -> str:
    """The benchmark's command line as a reader reruns it: paths in the clone relative, the data root as
    ``$SENTEMB_DATA``, and any other path of the machine that ran it as its option's name (``--cache CACHE``)."""
    root = record.get("data_root")
    words = []
    for word in in_clone(record["command"]):  # a record written before the clone's paths were made relative
        word = word.replace(root, "$SENTEMB_DATA") if root else word
        if word.startswith("/") and words and words[-1].startswith("--"):
            word = words[-1].lstrip("-").upper()
        words.append(word)
    return "`" + " ".join(words) + "`"


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


def bench_header(record: dict, detail: str = "") -> str:
    """The line above a benchmark's table: processor, torch, precision, date, what was timed, and the command."""
    bits = [processor(record), f"torch {record['versions'].get('torch')}"]
    if record["notes"].get("precision"):
        bits.append(f"precision {record['notes']['precision']}")
    bits += [record["date"]] + ([detail] if detail else [])
    return "; ".join(bits) + f". Command: {command_of(record)}."


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


def film_rows(data: Data) -> str:
    tasks = (*STS, "avg")
    lines = ["| model | " + " | ".join(NAMES[t] for t in tasks) + " | wall (s) |", "|---" * (len(tasks) + 2) + "|"]
    for study, label in (("start_mean", "all-MiniLM-L6-v2 as it is"), ("film_tfidf", "FILM over TF-IDF"),
                         ("film_frozen_encoder", "FILM over frozen all-MiniLM-L6-v2"),
                         ("film_deep_triplet", "FILM's deep form: triplet on a head over the frozen model")):
        for r in test_records(records.select(data, study)):
            lines.append(f"| {label} | " + " | ".join(fmt(r["test"][t]) for t in tasks) + f" | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def film_pairs(data: Data) -> str:
    record = newest(data.bench, "film_pairs")
    if record is None:
        return "No record yet: `python experiments/film_pairs.py --sts_dir $SENTEMB_DATA/sts --record` writes it."
    f, notes = record["figures"], record["notes"]
    lines = [bench_header(record), "",
             "| method | chosen on validation | val log loss | test accuracy | test F1 | test log loss | seconds |",
             "|---|---|---|---|---|---|---|"]
    for method in notes.get("methods", []):
        lines.append(f"| {method} | {notes['choices'][method]} | {f[f'{method} val_log_loss']:.3f} | "
                     f"{100 * f[f'{method} accuracy']:.2f} | {100 * f[f'{method} f1']:.2f} | "
                     f"{f[f'{method} log_loss']:.3f} | {f[f'{method} fit_s']:.1f} |")
    return "\n".join(lines)


def mining_nli(data: Data) -> str:
    """What mining the NLI files for the mined row kept and removed, from the newest ``mine.py --record`` record
    of the campaign (``results/benchmarks/mining_nli/``)."""
    from datamodules.mining import FILTERS, QUANTILES, quantile_key

    record = newest(data.bench, "mining_nli")
    if record is None:
        return "No record yet: the campaign mines the file before the mined row's dev grid."
    f = record["figures"]
    removed = "; ".join(f"{name} {f[f'removed {name}']:,}" for name in FILTERS)
    lines = [bench_header(record), "",
             f"{f['rows']:,} entailment pairs ({f['anchors']:,} distinct premises) against {f['corpus']:,} distinct "
             f"hypotheses: {f['candidates']:,} candidates seen. Removed: {removed}. Passed but not sampled: "
             f"{f['not_sampled']:,}. Rows written: {f['rows_written']:,}; rows left with too few candidates (not "
             f"written): {f['rows_short']:,}.", "",
             "| cosine, of what was written | " + " | ".join(f"{q:.0%}" for q in QUANTILES) + " |",
             "|---" * (len(QUANTILES) + 1) + "|"]
    for name in ("positive", "negative", "negative / positive"):
        if f"{name} q0" in f:
            lines.append(f"| {name} | " + " | ".join(f"{f[quantile_key(name, q)]:.3f}" for q in QUANTILES) + " |")
    return "\n".join(lines)


# -- SimCSE and DCLR on one footing (experiments/dclr_protocol.py) ---------------------------------------------
# the training scalars beside each dev cell (the mechanisms table below explains them): whether a search's cells
# left their objective work to do, and whether DCLR's weighting and noise acted in them
SEARCH_SCALARS = {"SimCSE": ("loss",), "DCLR": ("loss", "masked_fraction", "masking_batches_so_far", "noise_cos_shift")}


def protocol_search(data: Data) -> str:
    import dclr_protocol as dp

    lines = []
    for what, studies, knobs in (("SimCSE", ("protocol_simcse_dev",), {f"{dp.M}lr": dp.LRS}),
                                 ("DCLR", ("protocol_dclr_dev_phi", "protocol_dclr_dev_quantile"),
                                  {f"{dp.M}noise_beta": dp.BETAS, f"{dp.M}phi_quantile": dp.QUANTILES})):
        found = [r for st in studies for r in records.select(data, st)]
        # only what some cell logged: cells that ran before a scalar existed lack it
        scalars = [m for m in SEARCH_SCALARS[what] if any(m in r["mechanisms"] for r in found)]
        chosen = dp.choose(found)
        lines += [f"**{what}**: {len(found)} of {dp.BUDGET} dev cells"
                  + (f"; chosen: {chosen['cell']} (dev mean {dp.dev_mean(chosen):.2f})." if chosen else "."), "",
                  "| cell | best step | STS-B dev | SICK-R dev | dev mean | " + " | ".join(scalars) + " |",
                  "|---|---|---|---|---|" + "---|" * len(scalars)]
        for r in sorted(found, key=lambda r: (r["study"], r["cell"])):
            mark = " **(chosen)**" if chosen is not None and r is chosen else ""
            logged = [f"{scalar_of_run(r['mechanisms'][m], m):.4f}" if m in r["mechanisms"] else "—" for m in scalars]
            lines.append(f"| {r['cell']}{mark} | {r['selection']['step']} | {fmt(r['dev']['stsb'])} | "
                         f"{fmt(r['dev']['sickr'])} | {fmt(dp.dev_mean(r))} | " + " | ".join(logged) + " |")
        lines += [*edge_paragraph(at_the_edge(what, chosen, knobs)), ""]
    return "\n".join(lines).rstrip()


PAIRS = (  # (row, reference study, compared study): paired by seed on the seven-task test average
    ("DCLR (dev-chosen) - SimCSE (dev-chosen): the headline", "protocol_simcse", "protocol_dclr"),
    ("DCLR - SimCSE, both with dropout views at lr 3e-5: the earlier comparison", "protocol_simcse_dropout",
     "protocol_dclr_dropout"),
    ("noise only - SimCSE", "protocol_simcse", "protocol_dclr_noise_only"),
    ("weighting only - SimCSE", "protocol_simcse", "protocol_dclr_weighting_only"),
    ("neighbour batches: weighting only - SimCSE", "protocol_fn_simcse", "protocol_fn_weighting_only"),
    ("neighbour batches: DCLR - SimCSE", "protocol_fn_simcse", "protocol_fn_dclr"),
    ("distillation in place of weighting - noise only", "protocol_dclr_noise_only", "protocol_dclr_distill"),
    ("official form - SimCSE", "protocol_simcse", "protocol_dclr_official"),
)


def protocol_pairs(data: Data) -> str:
    lines = ["| comparison | seeds | reference | compared | difference (mean ± sd) | 95 % interval | paired t (p) | "
             "sign-flip p |", "|---|---|---|---|---|---|---|---|"]
    from campaign import CUT

    for label, a, b in PAIRS:
        if b in CUT:
            lines.append(f"| {label} | — | — | — | cut from the campaign: see the budget above | | | |")
            continue
        ra, rb = test_avgs(data, a), test_avgs(data, b)
        seeds = sorted(set(ra) & set(rb))
        if len(seeds) < 2:
            lines.append(f"| {label} | {len(seeds)} | — | — | not enough paired seeds yet | | | |")
            continue
        p = stats.paired(ra, rb)
        lines.append(f"| {label} | {', '.join(map(str, seeds))} | {stats.summary([ra[s] for s in seeds]).text()} | "
                     f"{stats.summary([rb[s] for s in seeds]).text()} | **{p.mean:+.2f}** ± {p.sd:.2f} | "
                     f"{p.low:+.2f} to {p.high:+.2f} | {p.t:.2f} ({p.p_t:.3f}) | {p.p_sign:.3f} |")
    return "\n".join(lines)


# masked_comp_cosine_so_far, not the per-step masked_comp_cosine of records made before it existed: that one was
# logged only at batches that masked, and Lightning wrote it again at every later logged step
# (SentenceEmbeddingModule._check_every_step), so its mean over logged steps repeated one batch's value.
def protocol_tasks(data: Data) -> str:
    """The headline per task: the start in the cls regime, each arm's mean ± sd over its seeds, DCLR - SimCSE per
    task over the paired seeds, and the papers' BERT-base rows with their own difference (cited, not measured)."""
    columns = (*STS, "avg")
    lines = ["| model | seeds | " + " | ".join(NAMES[t] for t in columns) + " |", "|---|---" + "|---" * len(columns) + "|"]
    for r in test_records(records.select(data, "start_cls_before_pooler")):
        lines.append("| all-MiniLM-L6-v2, first token's state (the start) | — | "
                     + " | ".join(fmt(r["test"][t]) for t in columns) + " |")
    arms = {}
    for label, study in (("SimCSE (dev-chosen)", "protocol_simcse"), ("DCLR (dev-chosen)", "protocol_dclr")):
        found = {r["seed"]: r["test"] for r in test_records(records.select(data, study))}
        arms[study] = found
        if found:
            lines.append(f"| {label} | {len(found)} | "
                         + " | ".join(stats.summary([t[c] for t in found.values()]).text() for c in columns) + " |")
    a, b = arms["protocol_simcse"], arms["protocol_dclr"]
    seeds = sorted(set(a) & set(b))
    if len(seeds) >= 2:
        diffs = [stats.paired({s: a[s][c] for s in seeds}, {s: b[s][c] for s in seeds}) for c in columns]
        lines.append(f"| DCLR - SimCSE, paired | {len(seeds)} | " + " | ".join(f"{d.mean:+.2f} ± {d.sd:.2f}" for d in diffs)
                     + " |")
    simcse, dclr = PAPERS["simcse_unsup"].paper_row, PAPERS["dclr_bert_base"].paper_row
    for row in (simcse, dclr):
        lines.append(f"| {row.row} ({row.citation}) | paper | " + " | ".join(fmt(row.scores[c]) for c in columns) + " |")
    lines.append("| DCLR - SimCSE, the papers' rows | paper | "
                 + " | ".join(fmt(dclr.scores[c] - simcse.scores[c], sign=True) for c in columns) + " |")
    return "\n".join(lines)


MECHANISMS = ("masked_fraction", "masked_fraction_so_far", "masking_batches_so_far", "kept_comp_cosine",
              "masked_comp_cosine_so_far", "noise_cos_shift", "distillation_kl",
              "distill_teacher_entropy", "distill_teacher_positive_mass", "distill_student_entropy",
              "distill_student_positive_mass")


# what every in-batch arm logs (lightning_modules/ranking.py's diagnostics): how much work its task leaves
TASK_SCALARS = ("loss", "accuracy", "alignment", "uniformity")


def scalar_of_run(logged: dict, name: str) -> float:
    """A training scalar's figure for the whole run: a ``*_so_far`` scalar already counts every batch
    (lightning_modules/dclr.py), so its last logged value; any other, its mean over the logged steps."""
    return logged["last"] if name.endswith("_so_far") else logged["mean"]


def mechanism_cell(values: list[float], seeds: int) -> str:
    """The mean ± sd over the seeds that logged the scalar, saying how many when not all of the arm's did
    (a scalar that records made before it existed lack, or one logged only once something happened)."""
    text = stats.summary(values).text(4)
    return text if len(values) in (0, seeds) else f"{text} ({len(values)} of {seeds} seeds)"


def protocol_mechanisms(data: Data) -> str:
    """Each arm's training scalars over its run (``scalar_of_run``), then mean over seeds: how hard its task was,
    and whether each mechanism acted."""
    studies = [st for _, a, b in PAIRS for st in (a, b)]
    shown = [m for m in (*TASK_SCALARS, *MECHANISMS)
             if any(m in r["mechanisms"] for st in studies for r in test_records(records.select(data, st)))]
    if not shown:
        return "No arm has finished yet."
    lines = ["| arm | seeds | " + " | ".join(shown) + " |", "|---|---|" + "---|" * len(shown)]
    for st in dict.fromkeys(studies):
        found = test_records(records.select(data, st))
        if not found:
            continue
        cells = [mechanism_cell([scalar_of_run(r["mechanisms"][m], m) for r in found if m in r["mechanisms"]],
                                len(found)) for m in shown]
        lines.append(f"| {st} | {len(found)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def protocol_transfer(data: Data) -> str:
    from records import TRANSFER

    lines = ["| model | seeds | " + " | ".join(t.upper() for t in TRANSFER) + " | avg |", "|---" * (len(TRANSFER) + 3) + "|"]
    for st, label in (("protocol_start_transfer", "start, as SentenceTransformer.encode gives it (unit vectors)"),
                      ("protocol_start_transfer_raw", "start, the pooled vectors unnormalised"),
                      ("protocol_simcse", "SimCSE (dev-chosen)"), ("protocol_dclr", "DCLR (dev-chosen)"),
                      ("protocol_dclr_noise_only", "noise only")):
        found = [r for r in records.select(data, st) if r["transfer"]]
        if found:
            cells = [stats.summary([r["transfer"][t] for r in found]).text() for t in (*TRANSFER, "transfer_avg")]
            lines.append(f"| {label} | {len(found)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else "No transfer record yet."


def front_simcse_dclr(data: Data) -> str:
    from campaign import SEEDS

    ra, rb = test_avgs(data, "protocol_simcse"), test_avgs(data, "protocol_dclr")
    seeds = sorted(set(ra) & set(rb))
    if len(seeds) < 2:
        return (f"SimCSE and DCLR at an equal tuning budget under the papers' protocol: fewer than two paired seeds "
                f"have a record yet (SimCSE {len(ra)} of {len(SEEDS)} seeds, DCLR {len(rb)} of {len(SEEDS)}; "
                "[the study](results/simcse_dclr.md) and its command).")
    p = stats.paired(ra, rb)
    so_far = f" of the {len(SEEDS)} planned" if len(seeds) < len(SEEDS) else ""  # the interval narrows as seeds land
    return (f"SimCSE and DCLR at an equal tuning budget under the papers' protocol (each chosen on dev from the same "
            f"number of cells), paired over {len(seeds)}{so_far} seeds: DCLR - SimCSE **{p.mean:+.2f}** ± {p.sd:.2f} on the "
            f"seven-task average (95 % interval {p.low:+.2f} to {p.high:+.2f}; paired t p {p.p_t:.3f}, exact "
            f"sign-flip p {p.p_sign:.3f}){dclr_mechanisms_clause(data)}; [the study](results/simcse_dclr.md).")


IDLE_WEIGHTING = 1e-3  # a weighting that masks less than one in-batch negative in a thousand leaves DCLR its noise


def dclr_mechanisms_clause(data: Data) -> str:
    """What DCLR's two mechanisms did in the headline's seeds, from the scalars that count every batch: the
    share of batches in which the weighting masked any negative and of the negatives it masked, and how far the
    noise moved; when the weighting was idle, that the comparison is in practice SimCSE plus noise negatives."""
    found = [r["mechanisms"] for r in test_records(records.select(data, "protocol_dclr"))]
    counted = [m for m in found if "masking_batches_so_far" in m and "masked_fraction_so_far" in m]
    if not counted:
        return ""
    batches = stats.summary([scalar_of_run(m["masking_batches_so_far"], "masking_batches_so_far") for m in counted])
    share = stats.summary([scalar_of_run(m["masked_fraction_so_far"], "masked_fraction_so_far") for m in counted])
    text = (f". In those runs DCLR's weighting masked any negative in {100 * batches.mean:.2f} % of training batches "
            f"and {share.mean:.1e} of the in-batch negatives (mean over {len(counted)} seeds)")
    shifts = [m["noise_cos_shift"]["mean"] for m in found if "noise_cos_shift" in m]
    if shifts:
        text += f", while its noise moved {stats.summary(shifts).mean:.3f} in cosine towards the anchors at each step"
    if share.mean < IDLE_WEIGHTING:
        from campaign import CUT

        text += ": the comparison is in practice SimCSE against SimCSE plus noise negatives"
        if "protocol_dclr_noise_only" in CUT:
            text += ", and the arm that would separate the two mechanisms (noise only) was cut from the budget"
    return text


MATRYOSHKA_ROWS = (("plain MNR", "mnr"), ("Matryoshka MNR", "mnr_matryoshka"))
MATRYOSHKA_PLOT = "docs/results/matryoshka.svg"
MATRYOSHKA_EMPTY = "No record yet: the campaign runs these rows after the objectives study."


def matryoshka_avgs(data: list[dict]) -> dict[str, dict[int, dict[int, float]]]:
    """Row -> dimensions -> seed -> seven-task test average: the whole embedding is each row's own test cell, each
    truncation an evaluation of that cell's checkpoint (objectives_<row>_dim<D>)."""
    from objectives import TRUNCATE_DIMS

    return {name: {d: test_avgs(data, f"objectives_{name}" if d == 384 else f"objectives_{name}_dim{d}")
                   for d in (384, *TRUNCATE_DIMS)} for _, name in MATRYOSHKA_ROWS}


def matryoshka_curve(data: Data) -> str:
    """Plain MNR and Matryoshka MNR on the seven test tasks at each dimension, as a table and its plot."""
    found = matryoshka_avgs(data)
    if not any(by_seed for by_dim in found.values() for by_seed in by_dim.values()):
        return MATRYOSHKA_EMPTY
    lines = ["| dimensions | " + " | ".join(label for label, _ in MATRYOSHKA_ROWS)
             + " | Matryoshka - plain, paired by seed |", "|---|---|---|---|"]
    for d in found["mnr"]:
        plain, mat = found["mnr"][d], found["mnr_matryoshka"][d]
        seeds = sorted(set(plain) & set(mat))
        diff = stats.summary([mat[s] - plain[s] for s in seeds]).text(2) if seeds else "—"
        lines.append(f"| {d} | {stats.summary(list(plain.values())).text()} | {stats.summary(list(mat.values())).text()} "
                     f"| {diff} |")
    plot = Path(MATRYOSHKA_PLOT).name  # the block's page, docs/results/objectives.md, sits beside it
    lines += ["", f"![The seven-task test average of plain and Matryoshka MNR at each dimension, mean and sd over the "
                  f"seeds]({plot})"]
    return "\n".join(lines)


def matryoshka_plot(data: Data) -> str:
    """The table of ``matryoshka_curve`` as a plot: the seven-task average against the dimensions kept."""
    found = matryoshka_avgs(data)
    series = []
    for label, name in MATRYOSHKA_ROWS:
        points = [svg_chart.Point(d, s.mean, s.sd) for d, by_seed in found[name].items()
                  if (s := stats.summary(list(by_seed.values()))).n]
        series.append(svg_chart.Series(label, points))
    return svg_chart.line_chart(series, title="Seven-task STS average (test) at the first d dimensions",
                                x_label="dimensions kept (log scale)", y_label="Spearman x 100, mean ± sd over seeds",
                                log2_x=True, empty=MATRYOSHKA_EMPTY)


def campaign_budget(data: Data) -> str:
    """The campaign's plan against its budget, from the records, and what was cut to fit it."""
    import campaign

    args = argparse.Namespace(data="$SENTEMB_DATA", threads=1, records=data.folder, out=ROOT / "runs" / "grid")
    plan = campaign.build_plan(args)
    state = campaign.State(plan, data.folder, known=list(data))
    parts: dict[str, list[int]] = {}
    for job in plan.jobs:
        counts = parts.setdefault(job.part, [0, 0, 0])
        counts[0] += state.done(job)
        counts[1] += 1
        counts[2] += state.estimate(job)[0] if not state.done(job) else 0
    summary = campaign.summarize(plan, state, jobs=2)
    lines = [f"The campaign (`python experiments/campaign.py --plan`): {summary.done} of {summary.done + summary.left} "
             f"planned cells have records; {summary.spent_h:.1f} core-hours spent, about {summary.left_h:.1f} left by "
             f"the records' wall times, against a budget of {campaign.BUDGET_CORE_HOURS:.0f}."
             + (f" That is {summary.spent_h + summary.left_h - campaign.BUDGET_CORE_HOURS:.1f} above it after all "
                "three cuts below: what is left is the headline, the front page's rows and the two newer rows, which "
                "the order of cuts does not reach." if summary.spent_h + summary.left_h > campaign.BUDGET_CORE_HOURS
                else ""), "",
             "| part | cells with a record | planned | core-hours left (estimated) |", "|---|---|---|---|"]
    for part, (done, planned, left) in parts.items():
        lines.append(f"| {part} | {done} | {planned} | {left / 3600:.1f} |")
    lines += ["", "Cut to fit the budget, in this order:", ""]
    lines += [f"- `{study}`: {why};" for study, why in campaign.CUT.items()]
    lines += [f"- the dev searches: {campaign.CUT_DEV_GRIDS};"]
    lines[-1] = lines[-1].rstrip(";") + "."
    return "\n".join(lines)


class Data(list):
    """The cell records (the list itself), the benchmark records (``bench``) and their folder: what every block
    reads."""

    def __init__(self, cells: list[dict], bench: list[dict], folder: Path = records.RECORDS) -> None:
        super().__init__(cells)
        self.bench = bench
        self.folder = folder


BLOCKS: dict[str, Callable[[list[dict]], str]] = {
    "readme_speed": readme_speed, "readme_first_commands": readme_first_commands, "perf_train": perf_train,
    "perf_profile": perf_profile, "perf_eval": perf_eval,
    "perf_scaling": perf_scaling, "film_rows": film_rows, "film_pairs": film_pairs,
    "protocol_search": protocol_search, "protocol_pairs": protocol_pairs, "protocol_mechanisms": protocol_mechanisms,
    "protocol_tasks": protocol_tasks,
    "protocol_transfer": protocol_transfer, "front_simcse_dclr": front_simcse_dclr, "campaign_budget": campaign_budget,
    "matryoshka_curve": matryoshka_curve, "mining_nli": mining_nli,
    "front_table": front_table, "front_findings": front_findings, "objectives_where": objectives_where,
    "start_table": start_table, "dev_grids": dev_grids, "test_table": test_table, "per_seed": per_seed_table,
}


def cells_csv(all_records: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["study", "cell", "seed", "data_seed", "rule", "step", "dev_stsb", "dev_sickr", *STS, "avg",
                     "train_precision", "eval_precision", "machine", "date", "commit"])
    for r in all_records:
        test = r["test"] or {}
        writer.writerow([r["study"], r["cell"], r["seed"], r["data_seed"], r["selection"]["rule"],
                         r["selection"]["step"], *(f"{r['dev'][k]:.4f}" if k in r["dev"] else "" for k in DEV),
                         *(f"{test[t]:.4f}" if t in test else "" for t in (*STS, "avg")),
                         r["precision"]["train"], r["precision"]["eval"], machine_text(r), r["date"], r["commit"]])
    return out.getvalue()


FILES: dict[str, Callable[[list[dict]], str]] = {"docs/results/cells.csv": cells_csv, MATRYOSHKA_PLOT: matryoshka_plot}


# -- the guards: one precision per study, test cells at the dev choice ----------------------------------------
def family(study: str) -> str:
    """The study a grid belongs to: its records share one table (``protocol_*``, ``objectives_*``, else itself)."""
    for prefix in ("protocol_", "objectives_"):
        if study.startswith(prefix):
            return prefix.rstrip("_")
    return study


def record_path(r: dict) -> str:
    return f"results/{r['study']}/{r['cell']}/seed{r['seed']}.json"


def check_precisions(data: list[dict]) -> None:
    """A study whose training records mix precisions cannot share a table: bf16 gives other numbers on a CPU
    with bf16 units than fp32 does, and fp32 agrees across processor families."""
    first: dict[str, dict] = {}
    for r in data:
        train = r["precision"]["train"]
        if train is None:  # an evaluation of a model as it is
            continue
        seen = first.setdefault(family(r["study"]), r)
        if str(seen["precision"]["train"]) != str(train):
            raise records.RecordError(
                f"{record_path(r)}: trained in precision {train}, but {record_path(seen)} of the same study "
                f"({family(r['study'])}) in {seen['precision']['train']}; one table holds one precision")


def overrides_of(r: dict) -> dict[str, str]:
    return {**dict(o.partition("=")[::2] for o in r["overrides"]), **r["values"]}


def check_choices(data: list[dict]) -> None:
    """Every test cell runs its dev grid's choice: the objectives' learning rate, SimCSE's view and learning rate,
    DCLR's settings (each compared with what the records of its dev grid choose)."""
    import dclr_protocol as dp
    import objectives as ob

    expected: dict[str, tuple[dict[str, str] | None, str]] = {}
    for name in (*ob.OBJECTIVES, *ob.NEWER, "dclr"):
        chosen = ob.choose(records.select(data, f"objectives_dev_{name}"))
        expected[f"objectives_{name}"] = ({"model.init_args.lr": lr_of(chosen)} if chosen else None,
                                          f"objectives_dev_{name}")
    simcse = dp.choose(records.select(data, "protocol_simcse_dev"))
    keep = (f"{dp.M}augmentation", f"{dp.M}lr")
    expected["protocol_simcse"] = ({k: dp.settings(simcse)[k] for k in keep} if simcse else None,
                                   "protocol_simcse_dev")
    dclr = dp.choose([r for st in ("protocol_dclr_dev_phi", "protocol_dclr_dev_quantile")
                      for r in records.select(data, st)])
    expected["protocol_dclr"] = (dp.settings(dclr) if dclr else None, "protocol_dclr_dev_*")
    for r in data:
        if r["study"] not in expected:
            continue
        want, dev = expected[r["study"]]
        if want is None:
            raise records.RecordError(f"{record_path(r)}: a test cell, but its dev grid ({dev}) has not chosen yet")
        have = overrides_of(r)
        wrong = {k: v for k, v in want.items() if have.get(k) != v}
        if wrong:
            key = next(iter(wrong))
            raise records.RecordError(f"{record_path(r)}: {key}={have.get(key)}, but its dev grid ({dev}) chose "
                                      f"{key}={wrong[key]}")


# -- writing and checking ------------------------------------------------------------------------------------
def render_page(text: str, rendered: dict[str, str], page: str) -> str:
    def replace(match: re.Match) -> str:
        name = match.group("name")
        if name not in rendered:
            raise SystemExit(f"error: {page}: block {name!r} has no generator in experiments/report.py")
        return f"{match.group(1)}{rendered[name]}\n{match.group(4)}"

    return BLOCK.sub(replace, text)


# A result figure typed in prose: a score (two decimals, 10 to 999), a signed difference (+3.57), a speed ratio
# (1.71x) or a difference in points (9.99 points). Hyperparameters (tau 0.05, lr 3e-5), versions (3.10, 2.13.0)
# and fractions (0.3 %) are not figures.
TYPED_FIGURE = re.compile(r"(?<![\w.])\d{2,3}\.\d{2}(?!\w|\.\d)|(?<![\w.])\d+\.\d+x\b"
                          r"|(?<![\w.])[+\u2212-]\d+\.\d{2}(?!\w|\.\d)|(?<![\w.])\d+(?:\.\d+)? (?:points?|pp)\b")


def typed_figures(root: Path = ROOT) -> list[str]:
    """``page:line: figure`` for every result figure in README.md and docs/ outside a generated block: a figure
    stands only where the records write it."""
    found = []
    for path in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        if not path.is_file():
            continue
        page = str(path.relative_to(root))
        text = path.read_text()
        blanked = BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keep the line numbers
        for number, line in enumerate(blanked.splitlines(), 1):
            for match in TYPED_FIGURE.finditer(line):
                found.append(f"{page}:{number}: {match.group(0)!r} typed outside a generated block: "
                             f"{line.strip()[:100]}")
    return found


def run(root: Path = ROOT, records_dir: Path | None = None, check: bool = False) -> list[str]:
    """Rewrite (or, with ``check``, compare) every generated block and file; returns the differences found."""
    folder = records_dir or root / "results"
    found = Data(records.load_all(folder), benchmark_records(folder), folder)
    check_precisions(found)
    check_choices(found)
    rendered = {name: block(found) for name, block in BLOCKS.items()}
    placed: set[str] = set()
    outputs = {}
    for page in PAGES:
        path = root / page
        text = path.read_text()
        placed |= {m.group("name") for m in BLOCK.finditer(text)}
        outputs[page] = (text, render_page(text, rendered, page))
    for name, make in FILES.items():
        path = root / name
        outputs[name] = (path.read_text() if path.exists() else "", make(found))
    problems = [f"block {name!r} is placed in no page of {', '.join(PAGES)}" for name in BLOCKS if name not in placed]
    if check:  # prose is the author's: the check names a typed figure, a rewrite leaves it to be moved by hand
        problems += typed_figures(root)
    for name, (old, new) in outputs.items():
        if old != new:
            diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), name, name + " (from records)",
                                                n=0))
            problems.append(f"{name} differs from what the records give:\n{diff[:3000]}")
            if not check:
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(new)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block or file differs")
    parser.add_argument("--records", type=Path, default=None, help="the records' folder (default: results/)")
    args = parser.parse_args(argv)
    try:
        problems = run(records_dir=args.records, check=args.check)
    except records.RecordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    unplaced = [p for p in problems if p.startswith("block ")]
    for p in problems if args.check else unplaced:
        print(p, file=sys.stderr)
    if args.check and problems:
        print("error: the docs differ from the records (run python experiments/report.py) or quote a result "
              "figure outside a generated block (move it into one)", file=sys.stderr)
        return 1
    if not args.check:
        for p in problems:
            if " differs from" in p:
                print(f"rewrote {p.split(' differs from', 1)[0]}")
        print(f"{len(problems) - len(unplaced)} page(s) or file(s) rewritten from the records")
    return 1 if unplaced else 0


if __name__ == "__main__":
    raise SystemExit(main())
