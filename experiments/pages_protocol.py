"""The blocks of SimCSE and DCLR on one footing (``experiments/dclr_protocol.py``, run by the campaign): the
budget, the searches, the paired comparisons, the headline per task, the mechanisms, the transfer tasks, and the
front page's sentence.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402
import stats  # noqa: E402
from papers import PAPERS  # noqa: E402
from records import ROOT, STS  # noqa: E402
from tables import (NAMES, PAIRS_HEADER, Data, at_the_edge, dev_mean, edge_paragraph, fmt, pair_row,  # noqa: E402
                    test_avgs, test_records)


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
    from campaign import CUT

    lines = list(PAIRS_HEADER)
    for label, a, b in PAIRS:
        lines.append(f"| {label} | — | — | — | cut from the campaign: see the budget above | | | |" if b in CUT
                     else pair_row(label, data, a, b))
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


def protocol_per_seed(data: Data) -> str:
    """The headline seed by seed: each arm's batch order, kept checkpoint, dev mean and test average, their
    difference, and how often DCLR's weighting masked (the whole-run count, where the record has it)."""
    arms = [{r["seed"]: r for r in test_records(records.select(data, st))} for st in ("protocol_simcse", "protocol_dclr")]
    seeds = sorted(set(arms[0]) | set(arms[1]))
    if not seeds:
        return "No seed has finished yet."
    lines = ["| seed | batch order | SimCSE best step | SimCSE dev mean | SimCSE test avg | DCLR best step | DCLR dev mean "
             "| DCLR test avg | DCLR - SimCSE | DCLR batches with a mask |", "|---" * 10 + "|"]
    for seed in seeds:
        cells, (simcse, dclr) = [], (arm.get(seed) for arm in arms)
        for r in (simcse, dclr):
            cells += [str(r["selection"]["step"]), fmt(dev_mean(r)), fmt(r["test"]["avg"])] if r else ["—"] * 3
        difference = fmt(dclr["test"]["avg"] - simcse["test"]["avg"], sign=True) if simcse and dclr else "—"
        masking = dclr and dclr["mechanisms"].get("masking_batches_so_far")
        share = f"{scalar_of_run(masking, 'masking_batches_so_far'):.2%}" if masking else "—"
        order = " / ".join(sorted({str(r["data_seed"]) for r in (simcse, dclr) if r}))  # one, unless the arms differ
        lines.append(f"| {seed} | {order} | " + " | ".join(cells) + f" | {difference} | {share} |")
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

    lines = ["| model | seeds | " + " | ".join(t.upper() for t in TRANSFER) + " | avg |",
             "|---" * (len(TRANSFER) + 3) + "|"]
    for st, label in (("protocol_start_transfer", "start, mean pooling, as SentenceTransformer.encode gives it (unit "
                                                  "vectors)"),
                      ("protocol_start_transfer_raw", "start, mean pooling, the pooled vectors unnormalised"),
                      ("protocol_simcse", "SimCSE (dev-chosen)"), ("protocol_dclr", "DCLR (dev-chosen)"),
                      ("protocol_dclr_noise_only", "noise only")):
        found = [r for r in records.select(data, st) if r["transfer"]]
        if found:
            cells = [stats.summary([r["transfer"][t] for r in found]).text() for t in (*TRANSFER, "transfer_avg")]
            lines.append(f"| {label} | {len(found)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else "No transfer record yet."


def front_simcse_dclr(data: Data) -> str:
    """The headline in one paragraph, for the README and docs/RESULTS.md: no link inside, since the two pages
    reach the study by different paths (each page links it in its own prose)."""
    from campaign import SEEDS

    ra, rb = test_avgs(data, "protocol_simcse"), test_avgs(data, "protocol_dclr")
    seeds = sorted(set(ra) & set(rb))
    if len(seeds) < 2:
        return (f"SimCSE and DCLR at an equal tuning budget under the papers' protocol: fewer than two paired seeds "
                f"have a record yet (SimCSE {len(ra)} of {len(SEEDS)} seeds, DCLR {len(rb)} of {len(SEEDS)}).")
    p = stats.paired(ra, rb)
    so_far = f" of the {len(SEEDS)} planned" if len(seeds) < len(SEEDS) else ""  # the interval narrows as seeds land
    return (f"SimCSE and DCLR at an equal tuning budget under the papers' protocol (each chosen on dev from the same "
            f"number of cells), paired over {len(seeds)}{so_far} seeds: DCLR - SimCSE **{p.mean:+.2f}** ± {p.sd:.2f} on the "
            f"seven-task average (95 % interval {p.low:+.2f} to {p.high:+.2f}; paired t p {p.p_t:.3f}, exact "
            f"sign-flip p {p.p_sign:.3f}{sign_floor(p)}){dclr_mechanisms_clause(data)}.")


def sign_floor(p: stats.Paired) -> str:
    """Says when the sign-flip p is the smallest its seeds allow (every difference of one sign: 2 of the 2^n
    patterns), so that a reader does not take 0.062 at five seeds for a weak result."""
    n = len(p.diffs)
    if p.p_sign > stats.sign_flip_floor(n) + 1e-12:
        return ""
    return f", the smallest {n} seeds allow: every seed's difference has one sign"


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


def campaign_budget(data: Data) -> str:
    """The campaign's plan against its budget, from the records, and what was cut to fit it."""
    import campaign

    args = argparse.Namespace(data="$SENTEMB_DATA", threads=1, records=data.folder, out=ROOT / "runs" / "grid")
    plan = campaign.build_plan(args)
    state = campaign.State(plan, data.folder, known=list(data))
    parts: dict[str, list[campaign.Job]] = {}
    for job in plan.jobs:
        parts.setdefault(job.part, []).append(job)
    summary = campaign.summarize(plan, state, jobs=2, remakes=False)  # the records' cells, the same on every clone
    lines = [f"The campaign (`python experiments/campaign.py --plan`): {summary.done} of {summary.done + summary.left} "
             f"planned cells have records; {summary.spent_h:.1f} core-hours spent, about {summary.left_h:.1f} left by "
             f"the records' wall times, against a budget of {campaign.BUDGET_CORE_HOURS:.0f}."
             + (f" That is {summary.spent_h + summary.left_h - campaign.BUDGET_CORE_HOURS:.1f} above it after all "
                "three cuts below: what is left is the headline, the front page's rows and the two newer rows, which "
                "the order of cuts does not reach." if summary.spent_h + summary.left_h > campaign.BUDGET_CORE_HOURS
                else ""), "",
             "| part | cells with a record | planned | core-hours spent | core-hours left (estimated) |",
             "|---|---|---|---|---|"]
    for part, jobs in parts.items():
        done = sum(state.done(j) for j in jobs)
        left = sum(state.estimate(j)[0] for j in jobs if not state.done(j))
        # a job that writes a benchmark record (the mined file, FILM's pairs) keeps no wall time in it
        spent = "—" if all(j.done_glob for j in jobs) else f"{state.spent(campaign.Plan(jobs)) / 3600:.1f}"
        lines.append(f"| {part} | {done} | {len(jobs)} | {spent} | {left / 3600:.1f} |")
    lines += ["", "Core-hours spent are the cell records' wall times x threads (every attempt of a cell); the jobs that "
              "write a benchmark record instead, the mined NLI file and FILM's pairs, keep none and count for none.",
              "", "Cut to fit the budget, in this order:", ""]
    lines += [f"- `{study}`: {why};" for study, why in campaign.CUT.items()]
    lines += [f"- the dev searches: {campaign.CUT_DEV_GRIDS};"]
    lines[-1] = lines[-1].rstrip(";") + "."
    return "\n".join(lines)
