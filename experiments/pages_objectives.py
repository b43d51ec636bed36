"""The blocks of the objectives study (``experiments/objectives.py``): the front page's table and findings, the
start model, the dev grids, the test tables, the rows compared by seed, the mined file, the Matryoshka curve, and
FILM's page.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402
import stats  # noqa: E402
import svg_chart  # noqa: E402
from objectives import LRS, choose  # noqa: E402
from papers import PAPERS, SBERT_STSB, PaperRow  # noqa: E402
from records import DEV, STS  # noqa: E402
from tables import (NAMES, PAIRS_HEADER, Data, at_the_edge, bench_header, chip, dev_mean, edge_paragraph,  # noqa: E402
                    fmt, lr_of, newest, pair_row, paired_seeds, test_avgs, test_records, where)

from harness.figures import figure  # noqa: E402


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


# The two starts the rows are measured from: (the start table's label, how the findings name it).
STARTS = {"start_mean": ("all-MiniLM-L6-v2, mean pooling", "the mean-pooled start"),
          "start_cls_before_pooler": ("all-MiniLM-L6-v2, first token's state (the cls regime)",
                                      "the first-token (cls) start")}


def start_table(all_records: list[dict]) -> str:
    lines = ["| start | " + " | ".join(NAMES[t] for t in (*STS, "avg")) + " |", "|---" * (len(STS) + 2) + "|"]
    for study, (label, _) in STARTS.items():
        for r in records.select(all_records, study):
            lines.append(f"| {label} | " + " | ".join(fmt(r["test"][t]) for t in (*STS, "avg")) + " |")
    return "\n".join(lines)


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


def front_findings(all_records: list[dict]) -> str:
    """The front table in sentences, one paragraph per start: which objectives raise their start, which lower it,
    and which move it less than their seeds vary (the 95 % interval of the mean difference from the start holds
    0)."""
    found = [text for start in STARTS if (text := _findings_from(all_records, start))]
    return " ".join(found) if found else "No objective has finished its test cells yet."


def _findings_from(all_records: list[dict], start_study: str) -> str | None:
    """The findings of the rows measured from ``start_study``; None while none of them has a test cell."""
    groups: dict[str, list[str]] = {"up": [], "down": [], "noise": [], "one": [], "shipped": []}
    start = records.select(all_records, start_study)
    phrase = STARTS[start_study][1]
    for row in OBJECTIVES:
        if row.start != start_study:
            continue
        study = f"objectives_{row.stem}" if row.budget == "lr" else row.stem
        tests = test_avgs(all_records, study)
        if not tests:
            continue
        if not start:
            return f"The record of {phrase} is missing; no finding from it yet."
        base = start[0]["test"]["avg"]
        if len(tests) == 1:  # a shipped form has one cell by design; an lr row has one seed so far
            groups["shipped" if row.budget == "shipped" else "one"].append(
                f"{row.label} {next(iter(tests.values())) - base:+.2f}")
        else:
            d = stats.paired({seed: base for seed in tests}, tests)  # against the start, a constant
            where = "up" if d.low > 0 else "down" if d.high < 0 else "noise"
            groups[where].append(f"{row.label} {d.mean:+.2f} (95 % interval {d.low:+.2f} to {d.high:+.2f})")
    if not any(groups.values()):
        return None
    sentences = [text + "; ".join(groups[key]) + "." for key, text in (
        ("up", "these raise the seven-task average: "), ("down", "these lower it: "),
        ("noise", "these move it less than their seeds vary: "), ("one", "one seed so far: "),
        ("shipped", "as shipped, one cell each: ")) if groups[key]]
    sentences[1:] = [s[0].upper() + s[1:] for s in sentences[1:]]
    return f"From {phrase} ({figure(start[0]['test']['avg'])}), over each choice's seeds, " + " ".join(sentences)


PAIRS = (  # (row, reference study, compared study): rows of the front table that differ in one thing, same seeds
    ("MNR: + the contradiction as hard negative - NLI pairs alone", "objectives_mnr", "objectives_mnr_hard_negatives"),
    ("MNR: 3 mined negatives - the contradiction", "objectives_mnr_hard_negatives", "objectives_mnr_mined"),
    ("MNR: Matryoshka dimensions - plain, both at 384", "objectives_mnr", "objectives_mnr_matryoshka"),
    ("DCLR (complementary: the seed's SimCSE) - unsupervised SimCSE", "objectives_simcse_unsup", "objectives_dclr"),
)


def objectives_pairs(data: Data) -> str:
    """The front table's rows that differ in one thing, paired by seed: each row's own dev choice, the same seeds
    and batch orders; and how small the sign-flip p can be at the seeds the rows have."""
    lines = [*PAIRS_HEADER, *(pair_row(label, data, a, b) for label, a, b in PAIRS)]
    counts = sorted({len(paired_seeds(data, a, b)) for _, a, b in PAIRS} - {0, 1})
    if counts:
        floors = ", ".join(f"{stats.sign_flip_floor(n):.3f} at {n} seeds" for n in counts)
        lines += ["", f"The exact sign-flip p cannot fall below 2 / 2^n, n the paired seeds ({floors}): with so few "
                      f"seeds, the 95 % interval says more."]
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
        diff = stats.summary([mat[s] - plain[s] for s in seeds]).text(sign=True) if seeds else "—"
        lines.append(f"| {d} | {stats.summary(list(plain.values())).text()} | {stats.summary(list(mat.values())).text()} "
                     f"| {diff} |")
    plot = Path(MATRYOSHKA_PLOT).name  # the block's page, docs/results/objectives.md, sits beside it
    for label, name in MATRYOSHKA_ROWS:
        if note := scored_elsewhere(data, label, name):
            lines += ["", note]
    lines += ["", f"![The seven-task test average of plain and Matryoshka MNR at each dimension, mean and sd over the "
                  f"seeds]({plot})"]
    return "\n".join(lines)


RETRAINED = ("a machine without a seed's checkpoint trains it again with the seed's own command before scoring it "
             "(`experiments/campaign.py`), so the 384 row is the record's checkpoint and the truncations are of its "
             "fp32 retraining.")


def scored_elsewhere(data: Data, label: str, name: str) -> str | None:
    """Says where a row's truncations scored other weights than its seeds' records: a machine that lacked the
    checkpoints (runs/ does not travel with the records) trained each seed there again with its own command before
    scoring it (experiments/campaign.py). The weights' digests in the records tell; records made before the
    digests were kept are told apart by their processors."""
    from objectives import TRUNCATE_DIMS

    trained = {r["seed"]: r for r in test_records(records.select(data, f"objectives_{name}"))}
    scored = [r for d in TRUNCATE_DIMS for r in test_records(records.select(data, f"objectives_{name}_dim{d}"))
              if r["seed"] in trained]
    if not scored:
        return None
    weights = lambda r: r["selection"].get("weights")  # noqa: E731
    if all(weights(r) for r in scored) and all(weights(r) for r in trained.values()):
        other = sorted({r["seed"] for r in scored if weights(r) != weights(trained[r["seed"]])})
        if not other:
            return None
        return (f"The {label} truncations of seed {', '.join(map(str, other))} scored other weights than the "
                f"seed's record (the records' weight digests differ): {RETRAINED}")
    trained_on = {chip(r["machine"]) for r in trained.values()}
    scored_on = {chip(r["machine"]) for r in scored}
    if scored_on <= trained_on:
        return None
    return (f"The {label} seeds were trained on {' and '.join(sorted(trained_on))}, their truncations scored on "
            f"{' and '.join(sorted(scored_on - trained_on))}: {RETRAINED}")


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
