"""What every generated block of the docs shares: the records as one ``Data``, and how a figure, a machine, a set
of records and a benchmark record read in a page. The blocks themselves are in ``pages_objectives.py``,
``pages_protocol.py`` and ``pages_speed.py``; ``report.py`` writes them into the pages.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402
import stats  # noqa: E402

from harness.figures import figure  # noqa: E402  (the one rounding rule: evaluate.py prints with it too)
from harness.measurement import in_clone  # noqa: E402


NAMES = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
         "stsb": "STS-B", "sickr": "SICK-R", "avg": "avg"}


class Data(list):
    """The cell records (the list itself), the benchmark records (``bench``) and their folder: what every block
    reads."""

    def __init__(self, cells: list[dict], bench: list[dict], folder: Path = records.RECORDS) -> None:
        super().__init__(cells)
        self.bench = bench
        self.folder = folder


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


def chip(machine: dict) -> str:
    """The GPU, or the processor with its bf16 units: what decides whether two records' speeds compare."""
    if machine.get("gpu"):
        return f"one {machine['gpu']}"
    return f"{machine['cpu']} ({', '.join(machine.get('bf16_units') or []) or 'no bf16 units'})"


def machine_text(record: dict) -> str:
    """A cell's machine: each cell ran in one process of the given threads."""
    m = record["machine"]
    return chip(m) if m.get("gpu") else f"{m['cores']} cores of an {chip(m)}, {m['threads']} thread(s) a cell"


def test_avgs(data: list[dict], study: str) -> dict[int, float]:
    """Seed -> seven-task test average of a study's records that scored the test tasks."""
    return {r["seed"]: r["test"]["avg"] for r in test_records(records.select(data, study))}


PAIRS_HEADER = ["| comparison | seeds | reference | compared | difference (mean ± sd) | 95 % interval | paired t (p) | "
                "sign-flip p |", "|---|---|---|---|---|---|---|---|"]


def paired_seeds(data: list[dict], reference: str, compared: str) -> list[int]:
    """The seeds at which both studies scored the test tasks."""
    return sorted(set(test_avgs(data, reference)) & set(test_avgs(data, compared)))


def pair_row(label: str, data: list[dict], reference: str, compared: str) -> str:
    """One row of a comparison table: two studies' seven-task test averages paired by seed (``compared -
    reference``), or what is missing while fewer than two seeds have both."""
    ra, rb = test_avgs(data, reference), test_avgs(data, compared)
    seeds = paired_seeds(data, reference, compared)
    if len(seeds) < 2:
        return f"| {label} | {len(seeds)} | — | — | not enough paired seeds yet | | | |"
    p = stats.paired(ra, rb)
    return (f"| {label} | {', '.join(map(str, seeds))} | {stats.summary([ra[s] for s in seeds]).text()} | "
            f"{stats.summary([rb[s] for s in seeds]).text()} | **{p.mean:+.2f}** ± {p.sd:.2f} | "
            f"{p.low:+.2f} to {p.high:+.2f} | {p.t:.2f} ({p.p_t:.3f}) | {p.p_sign:.3f} |")


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


# -- the benchmark records: results/benchmarks/<name>/<date>-<processor>.json (harness.measurement.write_record)
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
    """A benchmark's machine: the threads it timed with, of the machine's cores."""
    m = record["machine"]
    return chip(m) if m.get("gpu") else f"{chip(m)}, {m['threads']} thread(s) of {m['cores']} cores"


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


def bench_header(record: dict, detail: str = "") -> str:
    """The line above a benchmark's table: processor, torch, precision, date, what was timed, and the command."""
    bits = [processor(record), f"torch {record['versions'].get('torch')}"]
    if record["notes"].get("precision"):
        bits.append(f"precision {record['notes']['precision']}")
    bits += [record["date"]] + ([detail] if detail else [])
    return "; ".join(bits) + f". Command: {command_of(record)}."
