"""benchmarks/grid.py: every cell trained and evaluated, finished cells skipped on a rerun, the table, and the
HParams entry that tells cells apart."""
from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import ROOT
from tests.test_train import objective_config

sys.path.insert(0, str(ROOT / "benchmarks"))
import grid  # noqa: E402


def hparams_entry(cell) -> tuple[dict, dict[str, float]]:
    """The HParams plugin's values and the scalars of a cell's TensorBoard event file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    values, scalars = {}, {}
    for events in (cell / "hparams").glob("**/events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
        acc.Reload()
        for content in acc.PluginTagToContent("hparams").values():
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            if data.HasField("session_start_info"):
                for key, value in data.session_start_info.hparams.items():
                    values[key] = value.string_value if value.HasField("string_value") else value.number_value
        scalars.update({tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"]})
    return values, scalars


def training_scalar_tags(cell) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for events in (cell / "train").glob("**/events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    return tags


def test_grid_runs_two_cells_and_resumes_skipping_the_finished_one(tmp_path, tiny_model_dir, fixtures_dir, capsys):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule")
    argv = ["--name", "g", "--config", config, "--vary", "model.init_args.lr=1e-3,2e-3", "--seeds", "7",
            "--set", "model.init_args.weight_decay=0.02", "--set", "data.init_args.seed=42",
            "--sts_dir", str(fixtures_dir / "sts"), "--out", str(tmp_path / "out"), "--threads", "1"]
    assert grid.main(argv) == 0
    first, second = tmp_path / "out" / "g" / "lr=1e-3" / "seed7", tmp_path / "out" / "g" / "lr=2e-3" / "seed7"
    for cell, lr in ((first, "1e-3"), (second, "2e-3")):
        results = json.loads((cell / "eval.json").read_text())
        assert set(results) >= {"stsb", "sickr", "avg"}
        dev = json.loads((cell / "dev.json").read_text())
        assert {"stsb", "sickr"} <= set(dev) and dev["select"] == "last"
        assert (cell / "model.ckpt").resolve().name == "last.ckpt"
        # the HParams tab: every --set and --vary value, the seed, the data seed; hp_metric the seven-task average
        values, scalars = hparams_entry(cell)
        assert values["model.init_args.lr"] == lr and values["model.init_args.weight_decay"] == "0.02"
        assert values["data.init_args.seed"] == "42" and values["seed"] == 7 and values["data_seed"] == 42
        assert abs(scalars["hp_metric"] - results["avg"]) < 1e-4 and scalars["hp_metric"] != -1
        assert "hp_metric" not in training_scalar_tags(cell)  # no placeholder -1 from the training run
    table = (tmp_path / "out" / "g" / "table.md").read_text()
    assert "| lr=1e-3 | 1/1 |" in table and "| lr=2e-3 | 1/1 |" in table
    # a stop before the second cell finished: its result is gone, the first cell's stays
    finished = (first / "eval.json").stat().st_mtime_ns
    (second / "eval.json").unlink()
    capsys.readouterr()
    assert grid.main(argv) == 0
    out = capsys.readouterr().out
    assert "skip lr=1e-3/seed7 (finished)" in out and "train lr=2e-3/seed7" in out
    assert (first / "eval.json").stat().st_mtime_ns == finished
    assert (second / "eval.json").exists()


def test_select_best_keeps_the_best_dev_checkpoint_dev_only_and_seed_fills_set_values(tmp_path, tiny_model_dir, fixtures_dir):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule")
    argv = ["--name", "b", "--config", config, "--seeds", "5", "--select", "best", "--dev_only",
            "--set", "checkpoint.monitor=val/avg_spearman", "--set", "trainer.default_root_dir=unused_{seed}",
            "--sts_dir", str(fixtures_dir / "sts"), "--out", str(tmp_path / "out"), "--threads", "1"]
    assert grid.main(argv) == 0
    cell = tmp_path / "out" / "b" / "base" / "seed5"
    link = (cell / "model.ckpt").resolve()
    assert link.name.startswith("best-step")
    dev = json.loads((cell / "dev.json").read_text())
    assert dev["select"] == "best" and f"best-step{dev['step']}-" in link.name
    # the dev figures are the best checkpoint's: their mean is the highest validated
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    means = {}
    for events in (cell / "train").glob("**/events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
        acc.Reload()
        if "val/avg_spearman" in acc.Tags()["scalars"]:
            means.update({e.step: e.value for e in acc.Scalars("val/avg_spearman")})
    assert max(means, key=means.get) == dev["step"] - 1  # logged at the step before the checkpoint's count
    assert abs((dev["stsb"] + dev["sickr"]) / 2 - means[dev["step"] - 1]) < 1e-3
    assert json.loads((cell / "eval.json").read_text()) == {}  # --dev_only: no test task scored
    values, scalars = hparams_entry(cell)
    assert values["trainer.default_root_dir"] == "unused_5" and values["select"] == "best"
    assert values["scored"] == "dev only" and "hp_metric" not in scalars
    assert abs(scalars["hparam/dev_stsb"] - dev["stsb"]) < 1e-4


def test_vary_values_split_on_semicolons_when_they_hold_lists():
    assert grid.parse_vary("model.init_args.phi=0.5, 0.7") == ("model.init_args.phi", ["0.5", "0.7"])
    assert grid.parse_vary("model.init_args.features=[u,v];[abs_diff,prod]") == (
        "model.init_args.features", ["[u,v]", "[abs_diff,prod]"])


def test_paired_seeds_pairs_cells_by_seed(tmp_path, capsys):
    import paired_seeds

    for row, avgs in (("simcse", {42: 76.0, 43: 76.5, 44: 76.2, 45: 70.0}), ("dclr", {42: 77.0, 43: 77.1, 44: 77.5})):
        for seed, avg in avgs.items():
            cell = tmp_path / row / "base" / f"seed{seed}"
            cell.mkdir(parents=True)
            (cell / "eval.json").write_text(json.dumps({t: avg for t in paired_seeds.TASKS}))
    csv_path = tmp_path / "per_seed.csv"
    assert paired_seeds.main([str(tmp_path / "simcse" / "base"), str(tmp_path / "dclr" / "base"),
                              "--csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    # seed 45 has no pair; differences 1.0, 0.6, 1.3: mean 0.967, sd sqrt(0.2467 / 2) = 0.351 (by hand)
    assert "| 45 |" not in out and "| 43 | 76.50 | 77.10 | +0.60 |" in out
    assert "+0.97 ± 0.35" in out and "exact sign-flip p = 0.250" in out  # 2 of 8 sign patterns as extreme
    assert len(csv_path.read_text().splitlines()) == 1 + 2 * 3


def test_dclr_mechanisms_averages_logged_steps_then_cells(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    import dclr_mechanisms

    for seed, values in ((42, [0.1, 0.3]), (43, [0.4])):
        cell = tmp_path / "row" / f"seed{seed}"
        with SummaryWriter(str(cell / "train" / "lightning_logs" / "version_0")) as writer:
            for step, value in enumerate(values):
                writer.add_scalar("train/masked_fraction", value, step)
        (cell / "eval.json").write_text("{}")
    assert dclr_mechanisms.main([f"acting={tmp_path / 'row'}"]) == 0
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("| acting")][0]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == "acting (seed42, seed43)" and float(cells[3]) == 0.3  # (0.2 + 0.4) / 2
    assert cells[1] == "—"  # never logged


def test_dev_paired_matches_the_step_and_pairs_unfinished_cells_by_seed(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    import dev_paired

    curves = {"simcse": {42: [(49, 80.0), (99, 80.4), (149, 90.0)], 43: [(49, 80.1), (99, 80.2)]},
              "dclr": {42: [(49, 80.5), (99, 81.0)], 43: [(49, 80.9), (99, 80.7)], 44: [(49, 81.0)]}}
    for row, cells in curves.items():
        for seed, points in cells.items():
            with SummaryWriter(str(tmp_path / row / f"seed{seed}" / "train" / "version_0")) as writer:
                for step, value in points:
                    writer.add_scalar("val/avg_spearman", value, step)
    assert dev_paired.main(["--up_to", "99", f"SimCSE={tmp_path / 'simcse'}", f"DCLR={tmp_path / 'dclr'}"]) == 0
    out = capsys.readouterr().out
    # step 149 of SimCSE is past the matched step; seed 44 of DCLR has not validated at 99 and is left out.
    # best up to 99: SimCSE 80.40, 80.20; DCLR 81.00, 80.90 -> differences +0.60, +0.70 (by hand)
    assert "| SimCSE | 80.40 | 80.20 |" in out and "| DCLR | 81.00 | 80.90 |" in out
    assert "+0.65 ± 0.07 (n=2)" in out


def test_grid_csv_writes_each_finished_cell_and_never_overwrites(tmp_path):
    import grid_csv

    for label, seed, results, dev in (("base", 42, {"stsb": 80.0, "avg": 77.0}, {"stsb": 85.0, "sickr": 76.0, "step": 400}),
                                      ("base", 43, {}, {"stsb": 84.0, "sickr": 75.0, "step": None})):
        cell = tmp_path / "g" / label / f"seed{seed}"
        cell.mkdir(parents=True)
        (cell / "eval.json").write_text(json.dumps(results))
        (cell / "dev.json").write_text(json.dumps(dev))
    (tmp_path / "g" / "base" / "seed44").mkdir()  # unfinished: no eval.json
    out = tmp_path / "cells.csv"
    assert grid_csv.main([str(tmp_path / "g"), "--out", str(out)]) == 0
    import csv

    rows = list(csv.DictReader(out.open()))
    assert [r["seed"] for r in rows] == ["42", "43"]
    assert rows[0]["avg"] == "77.00" and rows[0]["dev_mean"] == "80.50" and rows[0]["dev_step"] == "400"
    assert rows[1]["avg"] == "" and rows[1]["dev_step"] == ""
    with pytest.raises(SystemExit, match="never overwritten"):
        grid_csv.main([str(tmp_path / "g"), "--out", str(out)])


def test_fraction_plot_reads_fraction_cells_and_adds_the_full_point(tmp_path):
    import fraction_plot

    for fraction, stsb in (("0.01", 80.0), ("0.1", 82.0)):
        cell = tmp_path / "g" / f"fraction={fraction}" / "seed42"
        cell.mkdir(parents=True)
        (cell / "eval.json").write_text("{}")
        (cell / "dev.json").write_text(json.dumps({"stsb": stsb, "sickr": 75.0}))
    assert fraction_plot.series_points([tmp_path / "g"]) == {0.01: (80.0, 75.0), 0.1: (82.0, 75.0)}
    full = tmp_path / "full"
    full.mkdir()
    (full / "dev.json").write_text(json.dumps({"stsb": 85.0, "sickr": 76.0}))
    out = tmp_path / "f.png"
    assert fraction_plot.main([f"SimCSE={tmp_path / 'g'}", "--full", f"SimCSE={full}", "--start", "79,75",
                               "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
