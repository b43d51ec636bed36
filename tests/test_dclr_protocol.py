"""experiments/dclr_protocol.py: the stages' grid commands, the dev-only choice, and the final stage built from it.
The grids themselves are experiments/grid.py (tests/test_grid.py); here each grid call is replaced by one that
writes the cells a finished grid leaves (``command``, ``dev.json``)."""
from __future__ import annotations

import itertools
import json
import shlex
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import dclr_protocol  # noqa: E402
import grid  # noqa: E402


def fake_grid(dev_of):
    """A stand-in for subprocess.run of grid.py: each cell gets its command and a dev.json from dev_of(label)."""
    calls = []

    def run(command, cwd=None, stdout=None):
        args = command[command.index("--name"):]
        name, out = args[1], command[command.index("--out") + 1]
        calls.append(command)
        sets = [command[i + 1] for i, w in enumerate(command) if w == "--set"]
        varied = [grid.parse_vary(command[i + 1]) for i, w in enumerate(command) if w == "--vary"]
        for values in itertools.product(*[v for _, v in varied]) if varied else [()]:
            assignment = {k: v for (k, _), v in zip(varied, values)}
            label = grid.cell_label(assignment)
            for seed in command[command.index("--seeds") + 1].split(","):
                cell = Path(out) / name / label / f"seed{seed}"
                cell.mkdir(parents=True, exist_ok=True)
                overrides = [o.replace("{seed}", seed) for o in [*sets, *(f"{k}={v}" for k, v in assignment.items())]]
                words = ["python", "train.py"] + [a for o in overrides for a in (f"--{o.partition('=')[0]}", o.partition("=")[2])]
                (cell / "command").write_text(shlex.join(words) + "\n")
                stsb, sickr = dev_of(name, label)
                (cell / "dev.json").write_text(json.dumps({"stsb": stsb, "sickr": sickr}))

        class Done:
            returncode = 0
        return Done()

    return run, calls


def test_choice_is_the_best_dev_cell_and_final_uses_it_with_the_other_complementary_model(tmp_path, monkeypatch):
    def dev_of(name, label):
        if name == "protocol_dev_noise_weighting":
            return (82.0, 78.0) if label == "noise_beta=0.2,phi_quantile=0.98" else (81.0, 78.0)
        if name == "protocol_dev_phi" and label == "phi=0.7":
            return (82.5, 78.0)  # the best of all: a one-factor change around the grid's best
        return (80.0, 77.0)

    run, calls = fake_grid(dev_of)
    monkeypatch.setattr(dclr_protocol.subprocess, "run", run)
    out = tmp_path / "grid"
    assert dclr_protocol.main(["--sts_dir", "sts", "--out", str(out), "--seeds", "7,8", "--jobs", "40",
                               "--stages", "arms,dev,dev2,final"]) == 0
    choice = json.loads((out / "protocol_choice.json").read_text())
    assert choice["cell"] == "protocol_dev_phi/phi=0.7/seed7" and choice["dev_mean"] == 80.25
    assert choice["complementary"] == "saw"
    # dev2 varies one factor around the best cell of the first dev grid
    dev_k = next(c for c in calls if "protocol_dev_k" in c)
    assert "model.init_args.noise_beta=0.2" in dev_k and "model.init_args.phi_quantile=0.98" in dev_k
    dev_phi = next(c for c in calls if "protocol_dev_phi" in c)
    assert not any("phi_quantile" in w for w in dev_phi)  # the fixed threshold replaces the quantile
    # no test task is scored before the choice: every dev grid is --dev_only
    for name in ("protocol_dev_noise_weighting", "protocol_dev_k", "protocol_dev_phi", "protocol_dev_comp_never"):
        assert "--dev_only" in next(c for c in calls if name in c)
    final = {c[c.index("--name") + 1]: c for c in calls if c[c.index("--name") + 1].startswith("protocol_dclr")}
    assert set(final) == {"protocol_dclr", "protocol_dclr_noise_only", "protocol_dclr_weighting_only",
                          "protocol_dclr_comp_never"}
    chosen = final["protocol_dclr"]
    assert "model.init_args.phi=0.7" in chosen and "model.init_args.noise_beta=0.2" in chosen
    assert any(w.endswith("protocol_simcse/base/seed{seed}/model.ckpt") for w in chosen)
    assert chosen[chosen.index("--seeds") + 1] == "7,8" and "--dev_only" not in chosen
    assert "model.init_args.use_weighting=false" in final["protocol_dclr_noise_only"]
    assert "model.init_args.use_noise=false" in final["protocol_dclr_weighting_only"]
    never = final["protocol_dclr_comp_never"]
    assert any(w.endswith("protocol_simcse_order1000/base/seed{seed}/model.ckpt") for w in never)
    assert not any(w.endswith("protocol_simcse/base/seed{seed}/model.ckpt") for w in never)


def test_stages_that_do_not_fit_in_jobs_run_one_after_another(tmp_path, monkeypatch, capsys):
    run, calls = fake_grid(lambda name, label: (80.0, 77.0))
    monkeypatch.setattr(dclr_protocol.subprocess, "run", run)
    assert dclr_protocol.main(["--sts_dir", "sts", "--out", str(tmp_path), "--jobs", "2", "--stages", "arms"]) == 0
    assert "10 cell(s), one after another" in capsys.readouterr().out
    assert all(c[c.index("--jobs") + 1] == "2" for c in calls)


def test_final_without_a_choice_and_unknown_stage_are_errors(tmp_path):
    with pytest.raises(SystemExit, match="protocol_choice.json is missing"):
        dclr_protocol.main(["--sts_dir", "sts", "--out", str(tmp_path), "--stages", "final"])
    with pytest.raises(SystemExit):
        dclr_protocol.main(["--sts_dir", "sts", "--out", str(tmp_path), "--stages", "arms,nope"])
