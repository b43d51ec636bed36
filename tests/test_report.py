"""Results as data: the records, the statistics against hand-computed values, and the docs regenerated from the
committed records with nothing drifting (experiments/records.py, stats.py, report.py)."""
from __future__ import annotations

import json
import math
import shutil
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import objectives  # noqa: E402
import records  # noqa: E402
import report  # noqa: E402
import stats  # noqa: E402
import tables  # noqa: E402
from papers import PAPERS  # noqa: E402

ATTEMPT = {"machine": {"cpu": "Test CPU", "bf16_units": [], "cores": 2, "threads": 1, "gpu": None},
           "versions": {"python": "3.11", "torch": "2.13.0"}, "commit": "abc", "started": "2026-12-06T00:00:00+00:00"}


def record(study: str, cell: str, seed: int, avg: float | None, dev=(80.0, 70.0), lr: str | None = None) -> dict:
    test = None if avg is None else {**{t: avg for t in records.STS}, "avg": avg, "subsets": {}, "pairs": {}}
    values = {"model.init_args.lr": lr} if lr else {}
    return records.build(study=study, cell=cell, values=values, overrides=[f"{k}={v}" for k, v in values.items()],
                         configs=["configs/x.yaml"], seed=seed, data_seed=seed,
                         selection={"rule": "best", "monitor": "val/avg_spearman", "step": 200},
                         dev_curve=[{"step": 0, "stsb": 1.0, "sickr": 2.0}], dev={"stsb": dev[0], "sickr": dev[1]},
                         test=test, transfer=None, mechanisms={}, wall_s=10.0, attempts=[ATTEMPT],
                         precision={"train": "32", "eval": "32"})


# -- statistics, against figures worked out by hand -----------------------------------------------------------
def test_paired_statistics_against_hand_computed_values():
    # differences 1.0, 0.6, 1.3: mean 0.9667; sd sqrt((0.0333^2 + 0.3667^2 + 0.3333^2) / 2) = 0.3512;
    # t = mean / (sd / sqrt 3) = 4.768. With 2 degrees of freedom Student's t has the closed form
    # P(|T| > t) = 1 - t / sqrt(t^2 + 2) = 0.0413, and t(0.975, 2) = 4.3027, so the interval is
    # 0.9667 ± 4.3027 * 0.2028 = [0.094, 1.839]. Sign flips: of the 8 patterns only all-plus and all-minus
    # reach |mean| 0.9667 (the others: 0.567, 0.3, 0.1), so p = 2/8.
    a = {42: 76.0, 43: 76.5, 44: 76.2, 45: 70.0}
    b = {42: 77.0, 43: 77.1, 44: 77.5}
    result = stats.paired(a, b)
    assert result.seeds == [42, 43, 44]  # seed 45 has no pair
    assert result.diffs == pytest.approx([1.0, 0.6, 1.3])
    assert result.mean == pytest.approx(0.96667, abs=1e-4) and result.sd == pytest.approx(0.35119, abs=1e-4)
    assert result.t == pytest.approx(4.768, abs=1e-3)
    assert result.p_t == pytest.approx(1 - result.t / math.sqrt(result.t ** 2 + 2), abs=1e-9)
    assert result.p_t == pytest.approx(0.0413, abs=1e-4)
    assert (result.low, result.high) == (pytest.approx(0.0943, abs=1e-3), pytest.approx(1.8391, abs=1e-3))
    assert result.p_sign == 0.25


def test_sign_flip_p_of_five_positive_pairs_is_its_floor():
    assert stats.sign_flip_p([1.2, 0.8, 1.1, 0.7, 1.3]) == 2 / 32


def test_summary_of_one_and_of_several_values():
    assert stats.summary([77.0]).text() == "77.00"
    assert stats.summary([1.0, 2.0, 3.0]).text() == "2.00 ± 1.00"  # sample sd: sqrt(2 / 2)
    assert stats.summary([]).text() == "—"
    with pytest.raises(ValueError, match="2 or more"):
        stats.paired({1: 1.0}, {1: 2.0})


# -- records ---------------------------------------------------------------------------------------------
def test_a_record_is_written_once_and_never_replaced_by_another(tmp_path):
    path = records.path_of(tmp_path, "s", "base", 42)
    first = record("s", "base", 42, 77.0)
    assert records.write(path, first) is True
    assert records.write(path, first) is False  # the same record: nothing to do
    with pytest.raises(records.RecordError, match="never overwritten"):
        records.write(path, record("s", "base", 42, 78.0))
    assert records.load(path)["test"]["avg"] == 77.0


@pytest.mark.parametrize("key", ["machine", "commit", "dev_curve", "selection"])
def test_a_record_missing_a_field_is_refused_naming_the_file_and_key(tmp_path, key):
    path = tmp_path / "s" / "base" / "seed42.json"
    path.parent.mkdir(parents=True)
    broken = record("s", "base", 42, 77.0)
    del broken[key]
    path.write_text(json.dumps(broken))
    with pytest.raises(records.RecordError, match=f"{path}: missing field '{key}'"):
        records.load_all(tmp_path)


def test_nested_fields_and_test_tasks_are_checked(tmp_path):
    broken = record("s", "base", 42, 77.0)
    del broken["test"]["sickr"]
    with pytest.raises(records.RecordError, match="missing field 'test.sickr'"):
        records.check(broken, "x.json")
    broken = record("s", "base", 42, 77.0)
    del broken["machine"]["cpu"]
    with pytest.raises(records.RecordError, match="missing field 'machine.cpu'"):
        records.check(broken, "x.json")


def test_dev_curve_counts_optimizer_steps_and_keeps_a_resumed_runs_last_value():
    series = {"val/stsb_spearman": [(0, 70.0), (99, 80.0), (199, 81.0), (199, 81.5)],
              "val/sickr_spearman": [(0, 60.0), (99, 61.0)]}
    assert records.dev_curve(series) == [{"step": 0, "stsb": 70.0, "sickr": 60.0},
                                         {"step": 100, "stsb": 80.0, "sickr": 61.0}, {"step": 200, "stsb": 81.5}]


# -- the docs from the records ---------------------------------------------------------------------------
def test_the_docs_are_what_the_committed_records_give():
    """A hand-edited cell, a stale table or a record missing a field all fail here (the tests below show each)."""
    assert report.run(check=True) == []


def dev_grid(results: Path, stem: str) -> None:
    """The dev grid of objectives_<stem>, seed 42: the three learning rates, whose dev means choose lr 3e-5."""
    for lr, dev in zip(objectives.LRS, ((84.0, 76.0), (85.0, 77.0), (85.0, 76.0))):
        study = f"objectives_dev_{stem}"
        records.write(records.path_of(results, study, f"lr={lr}", 42), record(study, f"lr={lr}", 42, None, dev=dev, lr=lr))


def chosen_test(results: Path, stem: str, seed: int, avg: float) -> None:
    """A test cell of objectives_<stem> at its dev grid's choice (lr 3e-5: report.check_choices)."""
    chosen = record(f"objectives_{stem}", "base", seed, avg)
    chosen["overrides"] = ["model.init_args.lr=3e-5"]
    records.write(records.path_of(results, f"objectives_{stem}", "base", seed), chosen)


@pytest.fixture()
def project(tmp_path):
    """A copy of the pages with generated blocks, and a small set of records of the front page's studies."""
    for page in report.PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    results = tmp_path / "results"
    records.write(records.path_of(results, "start_mean", "base", 42), record("start_mean", "base", 42, 78.0))
    dev_grid(results, "sts_regression")
    for seed, avg in ((42, 81.0), (43, 82.0), (44, 83.0)):
        chosen_test(results, "sts_regression", seed, avg)
    report.run(tmp_path)  # write the pages from these records
    return tmp_path


def test_the_front_table_holds_the_dev_choice_and_the_seeds_statistics(project):
    assert report.run(project, check=True) == []
    text = (project / "docs" / "RESULTS.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| SBERT STS-B regression"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # dev means 80, 81, 80.5: lr 3e-5 wins; test 81, 82, 83: mean 82, sd 1; start 78
    assert cells[2:8] == ["3 cells (lr)", "lr 3e-5", "42, 43, 44", "82.00 ± 1.00", "+4.00", "82.00 ± 1.00"]
    # the findings quote the table; the interval is 4 ± t(0.975, 2) · 1 / sqrt(3) = 4 ± 4.303 · 0.577 = 4 ± 2.48
    assert "these raise the seven-task average: SBERT STS-B regression +4.00 (95 % interval +1.52 to +6.48)" in text


def test_the_findings_measure_each_row_from_its_own_start(project):
    """A cls-pooled row is measured from the first-token start, in a sentence of its own after the mean-pooled
    rows', and a form run as shipped is not read as a row waiting for seeds."""
    results = project / "results"
    records.write(records.path_of(results, "start_cls_before_pooler", "base", 42),
                  record("start_cls_before_pooler", "base", 42, 70.0))
    dev_grid(results, "simcse_sup")
    for seed, avg in ((42, 74.0), (43, 75.0), (44, 76.0)):
        chosen_test(results, "simcse_sup", seed, avg)
    records.write(records.path_of(results, "film_tfidf", "base", 42), record("film_tfidf", "base", 42, 40.0))
    report.run(project)
    text = (project / "docs" / "RESULTS.md").read_text()
    findings = text.split("<!-- report:front_findings -->")[1].split("<!-- /report:front_findings -->")[0].strip()
    # test 74, 75, 76 against the cls start 70: +5 ± 4.303 · 1 / sqrt(3); the STS-B row's +4 stays on the mean start
    mean_part, cls_part = findings.split(" From the first-token (cls) start (70.00), over each choice's seeds, ")
    assert mean_part.startswith("From the mean-pooled start (78.00)") and "SBERT STS-B regression +4.00" in mean_part
    # FILM's forms have one cell by design, not one seed so far
    assert mean_part.endswith("As shipped, one cell each: FILM over TF-IDF -38.00.")
    assert cls_part == "these raise the seven-task average: supervised SimCSE (batch 64) +5.00 (95 % interval +2.52 " \
                       "to +7.48)."


def test_rows_that_differ_in_one_thing_are_paired_by_seed(project):
    """Two rows of the front table compared seed by seed: seed 45 of one row has no pair, a row with one seed is
    not compared yet, and the note gives the smallest sign-flip p at the paired seeds."""
    results = project / "results"
    for stem, avgs in (("mnr", (79.0, 79.5, 79.2, 70.0)), ("mnr_hard_negatives", (80.0, 80.1, 80.5))):
        dev_grid(results, stem)
        for seed, avg in zip((42, 43, 44, 45), avgs):
            chosen_test(results, stem, seed, avg)
    dev_grid(results, "mnr_mined")
    chosen_test(results, "mnr_mined", 42, 81.0)
    report.run(project)
    text = (project / "docs" / "results" / "objectives.md").read_text()
    rows = text.split("<!-- report:objectives_pairs -->")[1].split("<!-- /report:objectives_pairs -->")[0]
    # differences 1.0, 0.6, 1.3 (seeds 42 to 44): test_paired_statistics_against_hand_computed_values works them
    # out by hand, mean 0.97 ± 0.35, interval +0.09 to +1.84, t 4.77 (p 0.041), sign-flip 2 / 8
    assert "| MNR: + the contradiction as hard negative - NLI pairs alone | 42, 43, 44 | 79.23 ± 0.25 | " \
           "80.20 ± 0.26 | **+0.97** ± 0.35 | +0.09 to +1.84 | 4.77 (0.041) | 0.250 |" in rows
    assert "| MNR: 3 mined negatives - the contradiction | 1 | — | — | not enough paired seeds yet | | | |" in rows
    assert "(0.250 at 3 seeds)" in rows


def test_a_hand_edited_cell_fails_the_check(project):
    page = project / "docs" / "RESULTS.md"
    page.write_text(page.read_text().replace("82.00 ± 1.00", "82.50 ± 1.00", 1))
    problems = report.run(project, check=True)
    assert len(problems) == 1 and problems[0].startswith("docs/RESULTS.md differs from what the records give")
    assert "-| SBERT STS-B regression" in problems[0] and "82.50" in problems[0]


def test_a_new_record_makes_the_tables_stale(project):
    chosen_test(project / "results", "sts_regression", 45, 90.0)
    problems = report.run(project, check=True)
    assert {p.split(" ")[0] for p in problems} == {"README.md", "docs/RESULTS.md", "docs/results/objectives.md",
                                                   "docs/results/cells.csv"}  # README holds the findings too
    report.run(project)  # rewriting brings them back in line
    assert report.run(project, check=True) == []


def test_a_broken_record_stops_the_report_naming_it(project):
    path = records.path_of(project / "results", "objectives_sts_regression", "base", 43)
    broken = json.loads(path.read_text())
    del broken["precision"]
    path.write_text(json.dumps(broken))
    with pytest.raises(records.RecordError, match="seed43.json: missing field 'precision'"):
        report.run(project, check=True)


def test_every_block_is_placed_and_every_placed_block_has_a_generator(project):
    page = project / "docs" / "results" / "objectives.md"
    page.write_text(page.read_text().replace("<!-- report:per_seed -->", "<!-- report:per_sead -->")
                    .replace("<!-- /report:per_seed -->", "<!-- /report:per_sead -->"))
    with pytest.raises(SystemExit, match="block 'per_sead' has no generator"):
        report.run(project, check=True)


def bench_record(project, name: str, figures: dict, notes: dict, date: str = "2026-12-06") -> None:
    import json as _json

    path = project / "results" / "benchmarks" / name / f"{date}-test-cpu.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_json.dumps({"schema": 1, "benchmark": name, "command": ["python", f"benchmarks/{name}.py"],
                                 "machine": {**ATTEMPT["machine"], "threads": 1}, "versions": ATTEMPT["versions"],
                                 "commit": "abc", "date": date, "figures": figures, "notes": notes}))


def test_the_speed_tables_come_from_benchmark_records(project):
    figures = {"identical batches/ours / identical batches/theirs ratio": 2.04,
               "identical batches/ours, padded / identical batches/theirs ratio": 1.02,
               "identical batches/ours / identical batches/ours, padded ratio": 2.0,
               "identical batches/ours steps/s": 0.5, "identical batches/theirs steps/s": 0.245,
               "identical batches/ours, padded steps/s": 0.25, "identical batches/ours real token share": 0.43}
    bench_record(project, "train_throughput_padding_free", figures, {"precision": "32", "batch_size": 64,
                                                                     "max_length": 64, "steps": 8, "reps": 3})
    assert {p.split(" ")[0] for p in report.run(project, check=True)} == {"README.md", "docs/PERFORMANCE.md"}
    report.run(project)
    readme = (project / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| MNR training step, ours / sentence"))
    assert "**2.04x**" in row and "Test CPU (no bf16 units), 1 thread(s) of 2 cores; 2026-12-06" in row
    assert "| MNR training step, padding-free / padded, same batches (fp32) | **2.00x**" in readme
    assert "Processor families with a record: Test CPU without bf16 units." in readme
    assert report.run(project, check=True) == []
    # a benchmark record without its figures is refused, naming the file
    broken = next((project / "results" / "benchmarks").glob("*/*.json"))
    text = broken.read_text().replace('"figures"', '"figurez"')
    broken.write_text(text)
    with pytest.raises(records.RecordError, match="missing field 'figures'"):
        report.run(project, check=True)


def test_a_benchmark_command_names_no_path_of_the_machine_that_ran_it():
    record = {"data_root": "/data/root", "command": [
        "python", str(ROOT / "benchmarks" / "eval_speed.py"), "--sts_dir", "/data/root/sts", "--senteval_path",
        "/opt/SentEval", "--threads", "2", "--cache", "/scratch/embeddings.pt"]}
    assert tables.command_of(record) == ("`python benchmarks/eval_speed.py --sts_dir $SENTEMB_DATA/sts "
                                         "--senteval_path SENTEVAL_PATH --threads 2 --cache CACHE`")


def test_a_dev_choice_on_the_edge_of_its_search_is_named_and_one_inside_it_is_not():
    def dev(lr: str, mean: float, best: int) -> dict:
        r = record("objectives_dev_triplet", f"lr={lr}", 42, None, dev=(mean, mean), lr=lr)
        r["dev_curve"] = [{"step": s, "stsb": 1.0, "sickr": 1.0} for s in (0, 100, 200, 300)]
        r["selection"]["step"] = best
        return r

    grid = [dev("1e-5", 80.0, 100), dev("3e-5", 82.0, 200), dev("5e-5", 81.0, 300)]
    assert "edge of their search" not in report.dev_grids(grid)  # 3e-5, best at step 200 of 300
    grid[2] = dev("5e-5", 83.0, 200)
    assert "SBERT triplet (NLI), lr 5e-5 (the largest searched)." in report.dev_grids(grid)
    grid[1] = dev("3e-5", 84.0, 300)
    assert "SBERT triplet (NLI), its best checkpoint at the last dev evaluation (step 300)." in report.dev_grids(grid)
    assert "edge" not in report.dev_grids(grid[:2])  # no choice before the grid is whole


def test_the_mechanism_table_shows_each_finished_arms_task_scalars_and_only_the_mechanisms_it_logged(tmp_path):
    def arm(study: str, seed: int, **scalars: float) -> dict:
        r = record(study, "base", seed, 77.0)
        r["mechanisms"] = {k: {"mean": v, "last": v, "n": 8} for k, v in scalars.items()}
        return r

    assert report.protocol_mechanisms(report.Data([], [], tmp_path)) == "No arm has finished yet."
    dev = record("protocol_dclr_dev_phi", "noise_beta=0.1", 42, None)  # a dev cell is no arm
    dev["mechanisms"] = {"masked_fraction": {"mean": 0.5, "last": 0.5, "n": 8}}
    found = [arm("protocol_simcse", 42, loss=0.002, accuracy=1.0), arm("protocol_simcse", 43, loss=0.004, accuracy=1.0),
             arm("protocol_dclr", 42, loss=0.5, accuracy=0.75, masked_fraction=0.25, masking_batches_so_far=0.0), dev]
    found[2]["mechanisms"]["masking_batches_so_far"]["last"] = 0.125  # the whole run's count: its last value
    lines = report.protocol_mechanisms(report.Data(found, [], tmp_path)).splitlines()
    assert lines[0] == "| arm | seeds | loss | accuracy | masked_fraction | masking_batches_so_far |"
    assert lines[2] == "| protocol_simcse | 2 | 0.0030 ± 0.0014 | 1.0000 ± 0.0000 | — | — |"
    assert lines[3] == "| protocol_dclr | 1 | 0.5000 | 0.7500 | 0.2500 | 0.1250 |"
    # a second DCLR seed that logged what the first did not (a newer scalar): the cell says how many seeds have it
    found.append(arm("protocol_dclr", 43, loss=0.3, accuracy=0.75, masked_fraction=0.25, masking_batches_so_far=0.0,
                     masked_comp_cosine_so_far=0.95, masked_comp_cosine=0.9))
    lines = report.protocol_mechanisms(report.Data(found, [], tmp_path)).splitlines()
    assert lines[0].endswith("| masking_batches_so_far | masked_comp_cosine_so_far |")  # not the per-step one
    assert lines[3] == "| protocol_dclr | 2 | 0.4000 ± 0.1414 | 0.7500 ± 0.0000 | 0.2500 ± 0.0000 | 0.0625 ± 0.0884 | 0.9500 (1 of 2 seeds) |"


def test_each_dev_cell_of_a_search_shows_whether_its_mechanisms_acted(tmp_path):
    def cell(study: str, name: str, dev: tuple[float, float], **scalars: tuple[float, float]) -> dict:
        r = record(study, name, 42, None, dev=dev)
        r["mechanisms"] = {k: {"mean": mean, "last": last, "n": 8} for k, (mean, last) in scalars.items()}
        return r

    found = [cell("protocol_dclr_dev_phi", "noise_beta=0.05,phi=0.9", (86.0, 77.0), loss=(0.004, 0.001),
                  masked_fraction=(0.0, 0.0), masking_batches_so_far=(0.01, 0.02)),  # logged steps saw no mask
             cell("protocol_dclr_dev_quantile", "noise_beta=0.05,phi_quantile=0.95", (85.0, 76.0), loss=(0.003, 0.002),
                  masked_fraction=(0.05, 0.05), noise_cos_shift=(0.2, 0.19)),
             cell("protocol_simcse_dev", "augmentation=dropout,lr=3e-5", (85.0, 75.0), loss=(0.0025, 0.001))]
    text = report.protocol_search(report.Data(found, [], tmp_path))
    assert ("| cell | best step | STS-B dev | SICK-R dev | dev mean | loss | masked_fraction | masking_batches_so_far "
            "| noise_cos_shift |") in text
    assert "| noise_beta=0.05,phi=0.9 | 200 | 86.00 | 77.00 | 81.50 | 0.0040 | 0.0000 | 0.0200 | — |" in text
    assert "| noise_beta=0.05,phi_quantile=0.95 | 200 | 85.00 | 76.00 | 80.50 | 0.0030 | 0.0500 | — | 0.2000 |" in text
    assert "| augmentation=dropout,lr=3e-5 | 200 | 85.00 | 75.00 | 80.00 | 0.0025 |" in text


def test_the_front_pages_headline_counts_each_arms_seeds_until_two_are_paired(tmp_path):
    def data(simcse: tuple[int, ...], dclr: tuple[int, ...]) -> report.Data:
        return report.Data([record("protocol_simcse", "base", s, 77.0 + s / 100) for s in simcse]
                           + [record("protocol_dclr", "base", s, 77.5 + s / 100) for s in dclr], [], tmp_path)

    assert "(SimCSE 2 of 5 seeds, DCLR 0 of 5)." in report.front_simcse_dclr(data((42, 43), ()))
    assert "(SimCSE 2 of 5 seeds, DCLR 1 of 5)." in report.front_simcse_dclr(data((42, 43), (44,)))
    assert ("paired over 2 of the 5 planned seeds: DCLR - SimCSE **+0.50** ± 0.00"
            in report.front_simcse_dclr(data((42, 43), (42, 43))))
    every = (42, 43, 44, 45, 46)
    assert "paired over 5 seeds: DCLR - SimCSE **+0.50** ± 0.00" in report.front_simcse_dclr(data(every, every))
    assert "weighting" not in report.front_simcse_dclr(data(every, every))  # records without the whole-run counts
    assert "sign-flip p 0.062, the smallest 5 seeds allow: every seed's difference has one sign" in report.front_simcse_dclr(
        data(every, every))
    mixed = data(every, every)
    mixed[-1]["test"]["avg"] = 77.36  # DCLR's seed 46 0.1 below SimCSE's 77.46: 4 of the 32 patterns reach 0.38
    assert "sign-flip p 0.125)" in report.front_simcse_dclr(mixed)


@pytest.mark.parametrize("masked, idle", [(5e-4, True), (0.02, False)])
def test_the_front_pages_headline_says_what_dclrs_mechanisms_did(tmp_path, masked, idle):
    def dclr(seed: int, batches: float) -> dict:
        r = record("protocol_dclr", "base", seed, 78.0)
        r["mechanisms"] = {"masking_batches_so_far": {"mean": 0.5, "last": batches, "n": 8},
                           "masked_fraction_so_far": {"mean": 0.5, "last": masked, "n": 8},
                           "noise_cos_shift": {"mean": 0.2, "last": 0.3, "n": 8}}
        return r

    found = [record("protocol_simcse", "base", s, 77.0) for s in (42, 43)] + [dclr(42, 0.001), dclr(43, 0.003)]
    text = report.front_simcse_dclr(report.Data(found, [], tmp_path))
    assert (f"DCLR's weighting masked any negative in 0.20 % of training batches and {masked:.1e} of the in-batch "
            "negatives (mean over 2 seeds), while its noise moved 0.200 in cosine towards the anchors") in text
    assert ("in practice SimCSE against SimCSE plus noise negatives" in text) == idle


def test_a_record_names_the_clones_paths_relative_to_it_so_the_docs_are_the_same_in_any_clone(tmp_path,
                                                                                               monkeypatch):
    import harness.measurement as measurement

    monkeypatch.setattr(measurement, "machine", lambda threads=None: {"cpu": "AMD EPYC", "bf16_units": [],
                                                                      "cores": 2, "threads": 1, "gpu": None})
    monkeypatch.setattr(sys, "argv", [str(ROOT / "mine.py"), "--inputs", f"[{ROOT}/a.tsv,/data/b.tsv]", "--output",
                                      str(ROOT / "runs" / "mined.tsv"), "--cache", "/scratch/x"])
    path = measurement.write_record("mining_nli", {"rows": 1.0}, root=tmp_path)
    command = json.loads(path.read_text())["command"]
    assert command == ["python", "mine.py", "--inputs", "[a.tsv,/data/b.tsv]", "--output", "runs/mined.tsv",
                       "--cache", "/scratch/x"]


def test_the_scaling_table_runs_each_sweep_from_its_smallest_point(project):
    """The record's keys come sorted as text ("batch 1024" before "batch 64"); the table orders each sweep by size
    and divides each step by its work against the sweep's smallest point (worked out by hand below)."""
    figures = {}
    for sweep, size, step in (("batch", 1024, 64.0), ("batch", 64, 2.0), ("batch", 512, 48.0),
                              ("length", 128, 8.0), ("length", 32, 1.0)):
        figures.update({f"{sweep} {size} step_s": step, f"{sweep} {size} sentences_per_s": 1.0,
                        f"{sweep} {size} peak_mib": 100.0})
    bench_record(project, "scaling", dict(sorted(figures.items())), {"steps": 3, "grad_cache_from": 512,
                                                                        "grad_cache_mini_batch": 64})
    report.run(project)
    page = (project / "docs" / "PERFORMANCE.md").read_text()
    rows = [line.split(" | ")[0].removeprefix("| ") + " " + line.split(" | ")[-1].removesuffix(" |")
            for line in page.splitlines() if line.startswith(("| batch", "| max length"))]
    # per sentence: 2/64 = 1/32 first; 48/512 = 3/32 -> 3.00x; 64/1024 = 2/32 -> 2.00x. Per token: 1/32, 8/128 -> 2.00x
    assert rows == ["max length 32 1.00x per token", "max length 128 2.00x per token",
                    "batch 64 1.00x per sentence", "batch 512 (GradCache, 64 at a time) 3.00x per sentence",
                    "batch 1024 (GradCache, 64 at a time) 2.00x per sentence"]


def test_the_evaluation_table_gives_both_implementations_scores_and_times(project):
    figures = {"sts_ours_s": 80.0, "sts_plain_s": 120.0, "sts_ours_avg": 78.875, "sts_plain_avg": 78.875}
    for task, (acc, dev, a, b) in {"mr": (76.34, 76.87, 1000.0, 100.0), "mrpc": (70.0, 71.0, 300.0, 60.0)}.items():
        for side, seconds in (("senteval", a), ("ours", b)):
            figures.update({f"{task}_{side}_acc": acc, f"{task}_{side}_devacc": dev, f"{task}_{side}_s": seconds})
        figures[f"{task}_speedup"] = a / b
    figures.update({"mrpc_senteval_f1": 80.5, "mrpc_ours_f1": 80.5, "transfer_senteval_s": 1300.0,
                    "transfer_ours_s": 160.0, "transfer_speedup": 1300 / 160})
    bench_record(project, "eval_speed", figures, {"tasks": ["mr", "mrpc"]})
    report.run(project)
    page = (project / "docs" / "PERFORMANCE.md").read_text()
    assert "| ours: each distinct sentence once, by length | **80.0** | 78.88 |" in page
    assert "| MR | 76.34 (dev 76.87) | 76.34 (dev 76.87) | 1000 | 100.0 | **10.0x** |" in page
    assert "| MRPC | 70.00 (dev 71.00), F1 80.50 | 70.00 (dev 71.00), F1 80.50 | 300 | 60.0 | **5.0x** |" in page
    assert "| all | | | 1300 | 160 | **8.1x** |" in page


def test_no_figure_is_typed_outside_the_generated_blocks():
    """A score (two decimals, 10 or more), a signed difference, a speed ratio (1.71x) or points in the docs stand
    only inside a generated block; hyperparameters (tau 0.05, lr 3e-5) and versions are not figures."""
    assert report.typed_figures(ROOT) == []


@pytest.mark.parametrize("prose, figure", [("The gain is 9.99 points over the start.", "9.99 points"),
                                           ("It scores 81.23 on STS-B.", "81.23"), ("STS-B: 81.23.", "81.23"),
                                           ("Ours is 2.5x faster.", "2.5x"), ("SimCSE moves it by +0.42.", "+0.42")])
def test_the_check_names_a_figure_typed_in_prose(project, prose, figure):
    readme = project / "README.md"
    lines = readme.read_text().splitlines()
    lines.insert(3, prose)
    readme.write_text("\n".join(lines) + "\n")
    problems = report.run(project, check=True)
    assert [p.split(":", 2)[:2] for p in problems] == [["README.md", "4"]]
    assert f"{figure!r} typed outside a generated block" in problems[0]
    for harmless in ("tau 0.05 and lr 3e-5 on torch 2.13.0 (Python 3.10)", "a random 0.3 % of the sentences"):
        lines[3] = harmless
        readme.write_text("\n".join(lines) + "\n")
        assert report.run(project, check=True) == []


def test_evaluate_and_the_docs_round_a_figure_by_one_rule():
    """An STS average of 78.87498 is kept as 78.875 in its record: evaluate.py's table and the docs both show
    78.88 (the record's four decimals, then two, a tie to the even digit on the decimal digits)."""
    from harness.figures import figure
    from harness.sts_eval import format_table
    from harness.transfer import format_transfer_table

    full, kept = 78.87498, round(78.87498, 4)
    assert kept == 78.875
    table = format_table({"m": {"stsb": full, "avg": full}}, ["stsb"])
    assert table.splitlines()[-1] == "| m | 78.88 | 78.88 |"
    assert tables.fmt(kept) == tables.fmt(full) == "78.88"
    assert format_transfer_table({"m": {"mr": full}}, ["mr"]).splitlines()[-1] == "| m | 78.88 |"
    assert [figure(v) for v in (78.865, 78.875, 78.8651, 0.125)] == ["78.86", "78.88", "78.87", "0.12"]
    assert figure(-0.00001, sign=True) == "+0.00" and figure(1.2, sign=True) == "+1.20"
    assert figure(float("nan")) == "nan"


def test_a_one_seed_row_shows_its_record_as_evaluate_py_prints_it_and_a_mean_is_rounded_once():
    # 78.025 and 78.045 are ties on their decimal digits: evaluate.py and a record's figure show 78.02 and 78.04
    # (ties to the even digit), where Python's format of the binary float gives 78.03 and 78.05
    assert [stats.summary([v]).text() for v in (78.025, 78.045)] == ["78.02", "78.04"]
    assert stats.summary([0.5]).text(sign=True) == "+0.50"
    # a mean is rounded from its full value: 1.01497 is 1.01, where rounding it to four decimals first (1.0150)
    # would give 1.02
    assert stats.summary([1.01497, 1.01497]).text() == "1.01 ± 0.00"
    assert stats.summary([0.5, 1.5]).text(sign=True) == "+1.00 ± 0.71"


def test_an_evaluation_only_record_is_named_as_one_and_the_paper_column_says_what_its_figure_is(project):
    start = record("start_mean", "base", 42, 78.0)
    found = [start, {**start, "precision": {"train": None, "eval": "32"}}]
    assert tables.where(found).split("; ")[2:4] == ["eval only: eval 32", "trained: train 32, eval 32"]
    page = (project / "docs" / "RESULTS.md").read_text()
    assert "train None" not in page
    nli = next(line for line in page.splitlines() if line.startswith("| SBERT NLI softmax |"))
    stsb = next(line for line in page.splitlines() if line.startswith("| SBERT STS-B regression |"))
    assert ", seven-task avg (SBERT-NLI-base;" in nli.split(" | ")[-1]
    assert ", STS-B only (no seven-task avg) (SBERT-STSb-base;" in stsb.split(" | ")[-1]


def test_the_matryoshka_curve_pairs_each_truncation_by_seed(tmp_path):
    # plain MNR 80, 82 at 384 dims and 70, 74 at 64; Matryoshka 79, 81 and 75, 78: at 64 dims the paired
    # differences are +5 and +4, mean 4.50, sd 0.71 (sqrt(0.5))
    for study, seed, avg in (("objectives_mnr", 42, 80.0), ("objectives_mnr", 43, 82.0),
                             ("objectives_mnr_dim64", 42, 70.0), ("objectives_mnr_dim64", 43, 74.0),
                             ("objectives_mnr_matryoshka", 42, 79.0), ("objectives_mnr_matryoshka", 43, 81.0),
                             ("objectives_mnr_matryoshka_dim64", 42, 75.0),
                             ("objectives_mnr_matryoshka_dim64", 43, 78.0)):
        records.write(records.path_of(tmp_path, study, "base", seed), record(study, "base", seed, avg))
    table = report.matryoshka_curve(report.Data(records.load_all(tmp_path), [], tmp_path))
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert rows["384"] == "| 384 | 81.00 ± 1.41 | 80.00 ± 1.41 | -1.00 ± 0.00 |"
    assert rows["64"] == "| 64 | 72.00 ± 2.83 | 76.50 ± 2.12 | +4.50 ± 0.71 |"  # a difference: signed
    assert rows["32"] == "| 32 | — | — | — |"
    assert "trains it again" not in table  # every cell on one machine
    assert report.matryoshka_curve(report.Data([], [], tmp_path)).startswith("No record yet")
    # plain MNR's truncations scored on another processor: the checkpoints there were trained again, and it says so
    for seed in (42, 43):
        path = records.path_of(tmp_path, "objectives_mnr_dim64", "base", seed)
        moved = json.loads(path.read_text())
        moved["machine"] = {**moved["machine"], "cpu": "Other CPU", "bf16_units": ["avx512_bf16"]}
        path.write_text(json.dumps(moved))
    table = report.matryoshka_curve(report.Data(records.load_all(tmp_path), [], tmp_path))
    notes = [line for line in table.splitlines() if "trains it again" in line]
    assert len(notes) == 1 and notes[0].startswith(
        "The plain MNR seeds were trained on Test CPU (no bf16 units), their truncations scored on Other CPU "
        "(avx512_bf16):")
    # records that keep the digest of the weights they scored: it, not the processor, tells a retraining

    def weigh(study, seed, digest):
        path = records.path_of(tmp_path, study, "base", seed)
        kept = json.loads(path.read_text())
        kept["selection"]["weights"] = digest
        path.write_text(json.dumps(kept))

    for seed in (42, 43):
        for study in ("objectives_mnr", "objectives_mnr_dim64"):
            weigh(study, seed, f"{seed:016x}")
    assert "trains it again" not in report.matryoshka_curve(report.Data(records.load_all(tmp_path), [], tmp_path))
    weigh("objectives_mnr_dim64", 43, "0" * 16)
    table = report.matryoshka_curve(report.Data(records.load_all(tmp_path), [], tmp_path))
    notes = [line for line in table.splitlines() if "trains it again" in line]
    assert len(notes) == 1 and notes[0].startswith(
        "The plain MNR truncations of seed 43 scored other weights than the seed's record")


def test_the_matryoshka_plot_draws_each_rows_means_and_sds_from_the_records(tmp_path):
    from xml.etree import ElementTree

    import svg_chart

    # plain MNR at 384 and 64 dims: 80, 82 and 70, 74; Matryoshka at 64 dims only: 75, 78
    for study, seed, avg in (("objectives_mnr", 42, 80.0), ("objectives_mnr", 43, 82.0),
                             ("objectives_mnr_dim64", 42, 70.0), ("objectives_mnr_dim64", 43, 74.0),
                             ("objectives_mnr_matryoshka_dim64", 42, 75.0),
                             ("objectives_mnr_matryoshka_dim64", 43, 78.0)):
        records.write(records.path_of(tmp_path, study, "base", seed), record(study, "base", seed, avg))
    data = report.Data(records.load_all(tmp_path), [], tmp_path)
    svg = ElementTree.fromstring(report.matryoshka_plot(data))
    ns = "{http://www.w3.org/2000/svg}"
    dots = {c.find(ns + "title").text: float(c.get("cy")) for c in svg.iter(ns + "circle")}
    assert sorted(dots) == ["Matryoshka MNR, 64: 76.50 ± 2.12", "plain MNR, 384: 81.00 ± 1.41",
                            "plain MNR, 64: 72.00 ± 2.83"]
    # y grows upwards, linearly: the three means' heights keep their differences' ratios (81 - 76.5 : 76.5 - 72)
    top, mid, low = dots["plain MNR, 384: 81.00 ± 1.41"], dots["Matryoshka MNR, 64: 76.50 ± 2.12"], \
        dots["plain MNR, 64: 72.00 ± 2.83"]
    assert top < mid < low and abs((mid - top) - (low - mid)) < 0.2
    # one line for plain MNR's two points (Matryoshka has one: no line), and a whisker of 2 sd for each point
    assert len(list(svg.iter(ns + "polyline"))) == 1
    whiskers = [abs(float(w.get("y2")) - float(w.get("y1"))) for w in svg.iter(ns + "line")
                if w.get("x1") == w.get("x2")]
    scale = (low - top) / (81.0 - 72.0)
    assert sorted(round(w / scale, 1) for w in whiskers) == [2.8, 4.2, 5.7]
    assert "![" in report.matryoshka_curve(data) and "(matryoshka.svg)" in report.matryoshka_curve(data)
    assert "No record yet" in report.matryoshka_plot(report.Data([], [], tmp_path))
    assert [svg_chart.nice_step(s) for s in (9.0, 0.4, 230.0)] == [2, 0.1, 50]


def test_the_mining_block_gives_each_filters_count_and_the_kept_scores_from_the_newest_record(tmp_path):
    from datamodules.mining import FILTERS, QUANTILES, quantile_key

    def bench(date: str, relative: int) -> dict:
        figures = {"rows": 1200, "anchors": 1100, "corpus": 1190, "candidates": 36000, "not_sampled": 20000,
                   "rows_written": 1150, "rows_short": 50, **{f"removed {f}": 0 for f in FILTERS}}
        figures["removed relative_margin"] = relative
        figures.update({quantile_key(name, q): q / 2 for name in ("positive", "negative") for q in QUANTILES})
        return {"benchmark": "mining_nli", "command": ["python", "mine.py"], "date": date, "figures": figures,
                "machine": {"cpu": "AMD EPYC", "bf16_units": [], "cores": 2, "threads": 1, "gpu": None},
                "versions": {"torch": "2.13.0"}, "commit": "x", "notes": {}}

    assert report.mining_nli(report.Data([], [], tmp_path)).startswith("No record yet")
    text = report.mining_nli(report.Data([], [bench("2026-12-05", 7), bench("2026-12-06", 4321)], tmp_path))
    assert "relative_margin 4,321" in text and "relative_margin 7" not in text and "1,200 entailment pairs" in text
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["negative"] == "| negative | 0.000 | 0.025 | 0.125 | 0.250 | 0.375 | 0.475 | 0.500 |"
    assert "negative / positive" not in rows  # not in this record: no row


def test_a_days_later_benchmark_run_is_the_newest_whatever_its_processors_name(tmp_path, monkeypatch):
    import harness.measurement as measurement

    monkeypatch.setattr(measurement, "machine", lambda threads=None: {"cpu": "AMD EPYC 7763", "bf16_units": [],
                                                                      "cores": 2, "threads": 1, "gpu": None})
    for seconds in (73.0, 22.0, 30.0):  # three runs of one day on one processor: <slug>.json, -2.json, -3.json
        measurement.write_record("first_commands", {"quickstart_s": seconds}, root=tmp_path / "benchmarks")
    names = sorted(p.name for p in (tmp_path / "benchmarks" / "first_commands").iterdir())
    assert names[-1].endswith("-7763.json")  # by name, the first run sorts last ('-' before '.')
    found = tables.benchmark_records(tmp_path)
    assert [r["figures"]["quickstart_s"] for r in found] == [73.0, 22.0, 30.0]
    assert tables.newest(found, "first_commands")["figures"]["quickstart_s"] == 30.0


def test_the_readme_first_commands_come_from_their_record(tmp_path):
    data = report.Data([], [], tmp_path)
    assert "no record yet" in report.readme_first_commands(data)
    bench = {"benchmark": "first_commands", "command": ["python", "benchmarks/first_commands.py"], "date": "2026-12-06",
             "machine": {"cpu": "AMD EPYC", "bf16_units": [], "cores": 2, "threads": 2, "gpu": None},
             "figures": {"load_start": 2.56, "load_end": 3.34, "quickstart_s": 73.3, "quickstart_mb": 271.5},
             "versions": {}, "commit": "x", "notes": {}}
    text = report.readme_first_commands(report.Data([], [bench], tmp_path))
    assert "`make quickstart` took 73 s and left a 272 MB run directory" in text and "load average 2.6" in text
    assert "`make test` has no timed record yet" in text
    bench["figures"].update(tests_s=1647.0, tests_passed=660.0)
    assert "`make test` ran its 660 tests in 27 minutes" in report.readme_first_commands(report.Data([], [bench], tmp_path))


def test_the_headline_per_task_pairs_each_task_and_cites_the_papers_difference(tmp_path):
    def arm(study: str, seed: int, avg: float, stsb: float) -> dict:
        r = record(study, "base", seed, avg)
        r["test"]["stsb"] = stsb
        return r

    found = [arm("protocol_simcse", 42, 77.0, 80.0), arm("protocol_simcse", 43, 77.2, 80.4),
             arm("protocol_simcse", 44, 77.4, 80.2), arm("protocol_dclr", 42, 78.0, 81.0), arm("protocol_dclr", 43, 78.0, 80.6)]
    lines = report.protocol_tasks(report.Data(found, [], tmp_path)).splitlines()
    assert lines[0] == "| model | seeds | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | avg |"
    assert lines[2].startswith("| SimCSE (dev-chosen) | 3 | 77.20 ± 0.20 |") and "| 80.20 ± 0.20 |" in lines[2]
    # paired over seeds 42 and 43 only: avg +1.00 and +0.80, STS-B +1.00 and +0.20
    assert lines[4].startswith("| DCLR - SimCSE, paired | 2 | +0.90 ± 0.14 |")
    assert lines[4].endswith("| +0.60 ± 0.57 | +0.90 ± 0.14 | +0.90 ± 0.14 |")
    simcse, dclr = (PAPERS[p].paper_row.scores for p in ("simcse_unsup", "dclr_bert_base"))
    assert lines[-1] == ("| DCLR - SimCSE, the papers' rows | paper | "
                         + " | ".join(f"{dclr[t] - simcse[t]:+.2f}" for t in (*records.STS, "avg")) + " |")
    assert "paired" not in report.protocol_tasks(report.Data(found[:4], [], tmp_path))  # one pair is no row


def test_the_headline_seed_by_seed_pairs_what_each_seed_has(tmp_path):
    def arm(study: str, seed: int, avg: float, data_seed: int | None = None) -> dict:
        r = record(study, "base", seed, avg)
        r["data_seed"] = seed if data_seed is None else data_seed
        return r

    assert report.protocol_per_seed(report.Data([], [], tmp_path)) == "No seed has finished yet."
    dclr = arm("protocol_dclr", 42, 78.0)
    dclr["mechanisms"] = {"masking_batches_so_far": {"mean": 0.5, "last": 0.0025, "n": 8}}
    found = [arm("protocol_simcse", 42, 77.25), dclr, arm("protocol_simcse", 43, 77.0),
             arm("protocol_dclr", 44, 77.5, data_seed=7)]
    lines = report.protocol_per_seed(report.Data(found, [], tmp_path)).splitlines()
    assert lines[2] == "| 42 | 42 | 200 | 75.00 | 77.25 | 200 | 75.00 | 78.00 | +0.75 | 0.25% |"
    assert lines[3] == "| 43 | 43 | 200 | 75.00 | 77.00 | — | — | — | — | — |"  # DCLR's seed 43 still running
    assert lines[4] == "| 44 | 7 | — | — | — | 200 | 75.00 | 77.50 | — | — |"  # no whole-run count: no share
