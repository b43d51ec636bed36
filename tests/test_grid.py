"""experiments/grid.py: every cell trained and evaluated, finished cells skipped on a rerun, the table, the
HParams entry that tells cells apart, and each finished cell's record."""
from __future__ import annotations

import json
import sys

import pytest

import encoders
from harness import provenance
from tests.conftest import ROOT
from tests.test_train import objective_config

sys.path.insert(0, str(ROOT / "experiments"))
import grid  # noqa: E402
import records  # noqa: E402


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
            "--sts_dir", str(fixtures_dir / "sts"), "--out", str(tmp_path / "out"), "--threads", "1",
            "--records", str(tmp_path / "records")]
    assert grid.main(argv) == 0
    first, second = tmp_path / "out" / "g" / "lr=1e-3" / "seed7", tmp_path / "out" / "g" / "lr=2e-3" / "seed7"
    digests = set()
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
        # the record: the same figures, the overrides, the dev curve and where it ran
        record = records.load(tmp_path / "records" / "g" / f"lr={lr}" / "seed7.json")
        assert record["test"]["avg"] == results["avg"] and record["test"]["subsets"] == results["subsets"]
        assert record["values"] == {"model.init_args.lr": lr} and record["seed"] == 7 and record["data_seed"] == 42
        assert "model.init_args.weight_decay=0.02" in record["overrides"] and record["configs"] == [config]
        assert record["selection"] == {"rule": "last", "monitor": None, "step": None, "weights": results["weights"]}
        # the digest is of the checkpoint the cell chose, and it tells the two cells' weights apart
        assert results["weights"] == provenance.weights_digest(encoders.load(str(cell / "model.ckpt")))
        digests.add(results["weights"])
        assert [p["step"] for p in record["dev_curve"]][0] == 0 and record["dev_curve"][-1]["stsb"] == \
            pytest.approx(dev["stsb"], abs=1e-3)
        assert record["machine"]["threads"] == 1 and record["machine"]["cores"] >= 1 and record["attempts"] == 1
        assert record["versions"]["torch"] and record["mechanisms"]["loss"]["n"] > 0
        assert record["precision"]["eval"] == "bf16" and record["wall_s"] > 0
    assert len(digests) == 2
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
    # the second attempt at that cell found its record from the first: it is never overwritten
    assert "record " not in capsys.readouterr().out


def test_select_best_keeps_the_best_dev_checkpoint_dev_only_and_seed_fills_set_values(tmp_path, tiny_model_dir, fixtures_dir):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule")
    argv = ["--name", "b", "--config", config, "--seeds", "5", "--select", "best", "--dev_only",
            "--set", "checkpoint.monitor=val/avg_spearman", "--set", "trainer.default_root_dir=unused_{seed}",
            "--sts_dir", str(fixtures_dir / "sts"), "--out", str(tmp_path / "out"), "--threads", "1",
            "--records", str(tmp_path / "records")]
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
    record = records.load(tmp_path / "records" / "b" / "base" / "seed5.json")
    assert record["test"] is None and record["selection"] == {"rule": "best", "monitor": "val/avg_spearman",
                                                              "step": dev["step"], "weights": None}
    chosen = [p for p in record["dev_curve"] if p["step"] == dev["step"]]
    assert chosen and chosen[0]["stsb"] == pytest.approx(dev["stsb"], abs=1e-3)


def test_vary_values_split_on_semicolons_when_they_hold_lists():
    assert grid.parse_vary("model.init_args.phi=0.5, 0.7") == ("model.init_args.phi", ["0.5", "0.7"])
    assert grid.parse_vary("model.init_args.features=[u,v];[abs_diff,prod]") == (
        "model.init_args.features", ["[u,v]", "[abs_diff,prod]"])
