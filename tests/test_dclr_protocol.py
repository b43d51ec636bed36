"""experiments/dclr_protocol.py: both methods' dev searches have the same number of cells, each choice is made on
dev alone from the records, and the later stages are built from the choices with each seed's complementary model.
The grids themselves are experiments/grid.py (tests/test_grid.py); here each grid call is replaced by one that writes
the records a finished grid leaves."""
from __future__ import annotations

import itertools
import sys

import pytest

from tests.conftest import ROOT
from tests.test_report import record

sys.path.insert(0, str(ROOT / "experiments"))
import dclr_protocol  # noqa: E402
import grid  # noqa: E402
import records  # noqa: E402

M = "model.init_args."


def fake_grid(records_dir, dev_of):
    """A stand-in for subprocess.run of grid.py: each cell's record, its dev figures from dev_of(name, values)."""
    calls = []

    def run(command, cwd=None, stdout=None):
        calls.append(command)
        if "--model" in command:
            return type("Done", (), {"returncode": 0})()
        name = command[command.index("--name") + 1]
        sets = [command[i + 1] for i, w in enumerate(command) if w == "--set"]
        varied = [grid.parse_vary(command[i + 1]) for i, w in enumerate(command) if w == "--vary"]
        for values in itertools.product(*[v for _, v in varied]) if varied else [()]:
            assignment = {k: v for (k, _), v in zip(varied, values)}
            for seed in command[command.index("--seeds") + 1].split(","):
                r = record(name, grid.cell_label(assignment), int(seed), None if "--dev_only" in command else 77.0,
                           dev=dev_of(name, assignment))
                r["values"] = assignment
                r["overrides"] = [o.replace("{seed}", seed) for o in [*sets, *(f"{k}={v}" for k, v in assignment.items())]]
                records.write(records.path_of(records_dir, name, grid.cell_label(assignment), int(seed)), r)
        return type("Done", (), {"returncode": 0})()

    return run, calls


def by_name(calls):
    return {c[c.index("--name") + 1]: c for c in calls}


def test_equal_budgets_choices_on_dev_and_the_stages_built_from_them(tmp_path, monkeypatch):
    def dev_of(name, values):
        if name == "protocol_simcse_dev":
            best = values == {f"{M}augmentation": "token_shuffle", f"{M}lr": "5e-5"}
            return (82.0, 78.0) if best else (80.0, 77.0)
        if name == "protocol_dclr_dev_quantile" and values == {f"{M}noise_beta": "0.1", f"{M}phi_quantile": "0.99"}:
            return (82.5, 78.5)
        return (81.0, 77.0)

    run, calls = fake_grid(tmp_path / "records", dev_of)
    monkeypatch.setattr(dclr_protocol.subprocess, "run", run)
    out = tmp_path / "grid"
    argv = ["--sts_dir", "sts", "--transfer_dir", "senteval", "--out", str(out), "--records", str(tmp_path / "records"),
            "--seeds", "7,8,9,10,11"]
    assert dclr_protocol.main([*argv, "--stages", "simcse_dev,simcse,dclr_dev,final"]) == 0
    grids = by_name(calls)
    # the same budget: SimCSE's views x learning rates, DCLR's noise steps x weighting rules
    views, lrs = (grid.parse_vary(grids["protocol_simcse_dev"][i + 1])[1] for i, w in
                  enumerate(grids["protocol_simcse_dev"]) if w == "--vary")
    dclr_cells = sum(len(list(itertools.product(*[grid.parse_vary(c[i + 1])[1] for i, w in enumerate(c)
                                                  if w == "--vary"])))
                     for n, c in grids.items() if n.startswith("protocol_dclr_dev"))
    assert len(views) * len(lrs) == dclr_cells == dclr_protocol.BUDGET == 9
    for name in ("protocol_simcse_dev", "protocol_dclr_dev_phi", "protocol_dclr_dev_quantile"):
        assert "--dev_only" in grids[name] and grids[name][grids[name].index("--seeds") + 1] == "7"
    # SimCSE's choice is the arm on every seed; DCLR searches from that view and learning rate
    assert f"{M}augmentation=token_shuffle" in grids["protocol_simcse"] and f"{M}lr=5e-5" in grids["protocol_simcse"]
    assert grids["protocol_simcse"][grids["protocol_simcse"].index("--seeds") + 1] == "7,8,9,10,11"
    assert "--transfer_dir" in grids["protocol_simcse"] and "--set" not in grids["protocol_simcse_dropout"]
    assert f"{M}augmentation=token_shuffle" in grids["protocol_dclr_dev_phi"]
    # DCLR's choice on every seed, each with the SimCSE of its own seed as complementary model
    final = grids["protocol_dclr"]
    assert f"{M}noise_beta=0.1" in final and f"{M}phi_quantile=0.99" in final and "--dev_only" not in final
    comps = [w for w in final if w.startswith(f"{M}complementary_model=")]
    assert comps == [f"{M}complementary_model={out}/protocol_simcse/base/seed{{seed}}/model.ckpt"]
    dropout = grids["protocol_dclr_dropout"]
    assert f"{M}augmentation=dropout" in dropout and f"{M}lr=3e-5" in dropout
    assert any(w.endswith("protocol_simcse_dropout/base/seed{seed}/model.ckpt") for w in dropout)
    assert f"{M}use_weighting=false" in grids["protocol_dclr_noise_only"]
    assert grids["protocol_dclr_noise_only"][grids["protocol_dclr_noise_only"].index("--seeds") + 1] == "7,8,9"
    assert f"{M}use_noise=false" in grids["protocol_dclr_weighting_only"]

    calls.clear()
    assert dclr_protocol.main([*argv, "--stages", "false_negatives,distillation,official,transfer"]) == 0
    grids = by_name(calls)
    for name in ("protocol_fn_simcse", "protocol_fn_weighting_only", "protocol_fn_dclr"):
        assert f"data.init_args.neighbour_batches={dclr_protocol.START}" in grids[name]
    assert any(w.endswith("protocol_fn_simcse/base/seed{seed}/model.ckpt") for w in grids["protocol_fn_dclr"])
    assert f"{M}distillation_weight=1.0" in grids["protocol_dclr_distill"]
    assert f"{M}use_weighting=false" in grids["protocol_dclr_distill"]
    official = grids["protocol_dclr_official"]
    assert official.index("configs/dclr/official.yaml") < official.index("configs/overlays/dclr_protocol.yaml")
    starts = [c for c in calls if "--model" in c]
    # as grid.py reads them: one evaluate.py option each
    assert sorted(a for c in starts for a in grid.build_parser().parse_args(c[2:]).eval_arg) == [
        "--normalize=auto", "--normalize=no"]


def test_a_stage_before_its_choice_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match="SimCSE's dev search has 0 of 9 cells"):
        dclr_protocol.main(["--sts_dir", "sts", "--out", str(tmp_path), "--records", str(tmp_path), "--stages",
                            "simcse"])
    with pytest.raises(SystemExit):
        dclr_protocol.main(["--sts_dir", "sts", "--out", str(tmp_path), "--stages", "simcse,nope"])
