"""Every results table of the docs, written from the records: one command, and a check that nothing drifted.

    python experiments/report.py            # rewrite every generated block and file from results/
    python experiments/report.py --check    # change nothing; exit 1 naming each block that differs

A generated block sits in a markdown page between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``; the
text between the markers is this script's, and a hand edit there is undone by the next run (and fails
``--check``). Prose outside the blocks quotes no figure: the findings are generated blocks too. Each block is
a function of the records alone (``experiments/records.py``), named in ``BLOCKS`` below and kept with its study:
``pages_objectives.py`` (the objectives study, the front page, FILM), ``pages_protocol.py`` (SimCSE and DCLR on
one footing, the campaign's budget) and ``pages_speed.py`` (the benchmark records), on what ``tables.py`` shares;
statistics come from ``experiments/stats.py``, paper figures from ``experiments/papers.py``.
``docs/results/cells.csv`` (every record, one line each) and the plots (``experiments/svg_chart.py``: SVG text)
are written the same way. This file writes and checks the pages, and guards what may share a table.
"""
from __future__ import annotations

import argparse
import csv
import difflib
import io
import re
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402
from pages_objectives import (MATRYOSHKA_PLOT, dev_grids, film_pairs, film_rows,  # noqa: E402
                              front_findings, front_table, matryoshka_curve, matryoshka_plot, mining_nli,
                              objectives_pairs, objectives_where, per_seed_table, start_table, test_table)
from pages_protocol import (campaign_budget, front_simcse_dclr, protocol_mechanisms, protocol_pairs,  # noqa: E402
                            protocol_per_seed, protocol_search, protocol_tasks, protocol_transfer)
from pages_speed import (perf_eval, perf_profile, perf_scaling, perf_train, readme_first_commands,  # noqa: E402
                         readme_speed)
from records import DEV, ROOT, STS  # noqa: E402
from tables import Data, benchmark_records, lr_of, machine_text  # noqa: E402

BLOCK = re.compile(r"(<!-- report:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /report:(?P=name) -->)", re.S)
PAGES = ("README.md", "docs/RESULTS.md", "docs/results/objectives.md", "docs/results/simcse_dclr.md",
         "docs/PERFORMANCE.md", "docs/EVALUATION.md", "docs/FILM.md")


# every generated block by name, as the pages place them (<!-- report:NAME -->), grouped by the module that writes it
BLOCKS: dict[str, Callable[[list[dict]], str]] = {
    # pages_objectives.py: the front page, the objectives study and FILM's page
    "front_table": front_table, "front_findings": front_findings, "objectives_where": objectives_where,
    "start_table": start_table, "dev_grids": dev_grids, "test_table": test_table, "per_seed": per_seed_table,
    "objectives_pairs": objectives_pairs,
    "mining_nli": mining_nli, "matryoshka_curve": matryoshka_curve, "film_rows": film_rows, "film_pairs": film_pairs,
    # pages_protocol.py: SimCSE and DCLR on one footing, and the campaign's budget
    "front_simcse_dclr": front_simcse_dclr, "campaign_budget": campaign_budget, "protocol_search": protocol_search,
    "protocol_pairs": protocol_pairs, "protocol_per_seed": protocol_per_seed, "protocol_tasks": protocol_tasks,
    "protocol_mechanisms": protocol_mechanisms, "protocol_transfer": protocol_transfer,
    # pages_speed.py: the benchmark records
    "readme_speed": readme_speed, "readme_first_commands": readme_first_commands, "perf_train": perf_train,
    "perf_profile": perf_profile, "perf_eval": perf_eval, "perf_scaling": perf_scaling,
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
            raise SystemExit(f"error: {page}: block {name!r} has no generator in experiments/report.py's BLOCKS")
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
