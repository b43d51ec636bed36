"""benchmarks/grid.py: every cell trained and evaluated, finished cells skipped on a rerun, the table."""
from __future__ import annotations

import json
import sys

from tests.conftest import ROOT
from tests.test_train import objective_config

sys.path.insert(0, str(ROOT / "benchmarks"))
import grid  # noqa: E402


def test_grid_runs_two_cells_and_resumes_skipping_the_finished_one(tmp_path, tiny_model_dir, fixtures_dir, capsys):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule")
    argv = ["--name", "g", "--config", config, "--vary", "model.init_args.lr=1e-3,2e-3", "--seeds", "7",
            "--sts_dir", str(fixtures_dir / "sts"), "--out", str(tmp_path / "out"), "--threads", "1"]
    assert grid.main(argv) == 0
    first, second = tmp_path / "out" / "g" / "lr=1e-3" / "seed7", tmp_path / "out" / "g" / "lr=2e-3" / "seed7"
    for cell in (first, second):
        results = json.loads((cell / "eval.json").read_text())
        assert set(results) >= {"stsb", "sickr", "avg"}
        assert set(json.loads((cell / "dev.json").read_text())) == {"stsb", "sickr"}
        assert list((cell / "hparams").glob("**/events.out.tfevents.*"))  # TensorBoard's HParams tab
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


def test_vary_values_split_on_semicolons_when_they_hold_lists():
    assert grid.parse_vary("model.init_args.phi=0.5, 0.7") == ("model.init_args.phi", ["0.5", "0.7"])
    assert grid.parse_vary("model.init_args.features=[u,v];[abs_diff,prod]") == (
        "model.init_args.features", ["[u,v]", "[abs_diff,prod]"])
