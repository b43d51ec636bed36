"""Exact resume wherever a run stops: mid-epoch, at an epoch's end before and after its validation, after a
failed save, and when the newest file is a ``best-*`` checkpoint. Each resumed run ends with the weights of a run
that never stopped, bit for bit (fp32, one process, the same machine and torch thread count), and trains the same batches in the same
order; ``--ckpt_path last`` takes the checkpoint furthest into training (``harness.checkpoint.resume_checkpoint``)."""
from __future__ import annotations

import glob
import json
import os
import re
import time
from pathlib import Path

import pytest
import torch

import train
from tests.faults import FAIL_SAVE_ENV
from tests.test_reliability import FAST, checkpoints, run_config, train_script

# 96 fixture pairs in batches of 16: 6 steps an epoch, 3 epochs; validation at each epoch's end; last.ckpt
# after every step, so every boundary has a checkpoint.
STEPS = 18
ARGS = [*FAST, "--last_checkpoint.every_n_train_steps", "1", "--trainer.max_steps", str(STEPS)]
TRAINER = {"max_steps": STEPS, "val_check_interval": 1.0, "check_val_every_n_epoch": 1, "precision": "32"}


def config_for(root: Path, tiny: str, fixtures: Path, fail_saves: bool = False) -> str:
    config = run_config(root, tiny, fixtures, trainer=TRAINER)
    if fail_saves:
        import yaml

        data = yaml.safe_load(Path(config).read_text())
        data["trainer"]["plugins"] = [{"class_path": "tests.faults.FailingCheckpointIO"}]
        Path(config).write_text(yaml.safe_dump(data))
    return config


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir, fixtures_dir) -> dict:
    root = tmp_path_factory.mktemp("uninterrupted")
    train.main(["--config", config_for(root, tiny_model_dir, fixtures_dir), *ARGS])
    final = torch.load(checkpoints(root, "last.ckpt")[-1], weights_only=True)
    steps = [json.loads(line) for line in (root / "seen.jsonl").read_text().splitlines()]
    return {"state": final["state_dict"], "rows": {s["step"]: s["rows"] for s in steps}}


def resumed_line(text: str) -> tuple[str, int]:
    found = re.findall(r"--ckpt_path last: resuming from (\S+) \(step (\d+)\)", text)
    assert len(found) == 1, text[-2000:]
    return os.path.basename(found[0][0]), int(found[0][1])


def finish_and_compare(root: Path, config: str, reference: dict, caplog) -> tuple[str, int]:
    """Resume to the end with the one command line of a requeued job; the weights and every batch must be
    the uninterrupted run's."""
    caplog.clear()
    cli = train.main(["--config", config, *ARGS, "--ckpt_path", "last"])
    took = resumed_line(caplog.text)
    assert cli.trainer.global_step == STEPS
    final = torch.load(cli.trainer.checkpoint_callback.last_model_path, weights_only=True)["state_dict"]
    differences = {k: (final[k] - v).abs().max().item() for k, v in reference["state"].items()}
    assert max(differences.values()) == 0.0, {k: d for k, d in differences.items() if d}
    seen = [json.loads(line) for line in (root / "seen.jsonl").read_text().splitlines()]
    last_run = [s for s in seen if s["pid"] == seen[-1]["pid"]]  # the resumed run's own steps
    assert [s["step"] for s in last_run] == list(range(took[1] + 1, STEPS + 1))
    assert all(s["rows"] == reference["rows"][s["step"]] for s in last_run)  # the same batches, in order
    return took


@pytest.mark.slow
@pytest.mark.parametrize("fault, stopped_at, expected", [
    ("SIGKILL@3", "mid-epoch", ("last.ckpt", 3)),
    ("SIGKILL@v6", "epoch end, before its validation", ("last.ckpt", 6)),
    ("SIGKILL@6", "epoch end, after its validation", ("last.ckpt", 6)),
])
def test_a_killed_run_resumes_to_the_uninterrupted_weights(tmp_path, tiny_model_dir, fixtures_dir, reference, caplog,
                                                          fault, stopped_at, expected):
    config = config_for(tmp_path, tiny_model_dir, fixtures_dir)
    killed = train_script(config, *ARGS[2:], "--ckpt_path", "last", fault=fault)
    assert killed.returncode == -9, killed.stderr[-3000:]
    if stopped_at.endswith("before its validation"):  # no validation of step 6 was written
        assert not glob.glob(str(tmp_path / "runs" / "**" / "best-step6-*.ckpt"), recursive=True)
    assert finish_and_compare(tmp_path, config, reference, caplog) == expected


@pytest.mark.slow
def test_a_failed_save_at_the_epoch_end_stops_the_run_and_the_resume_is_exact(tmp_path, tiny_model_dir, fixtures_dir,
                                                                             reference, caplog):
    # last.ckpt of step 6 is written after the step (whole), then again after the epoch-end validation: that
    # second write fails as on a full disk. The run stops (exit 3) with the first one intact.
    config = config_for(tmp_path, tiny_model_dir, fixtures_dir, fail_saves=True)
    failed = train_script(config, *ARGS[2:], "--ckpt_path", "last", env={FAIL_SAVE_ENV: "6:2"})
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert failed.stderr.strip().splitlines()[-1].endswith("last.ckpt: No space left on device")
    assert torch.load(checkpoints(tmp_path, "last.ckpt")[-1], weights_only=True)["global_step"] == 6
    assert finish_and_compare(tmp_path, config, reference, caplog) == ("last.ckpt", 6)


@pytest.mark.slow
def test_last_takes_the_furthest_checkpoint_not_the_newest_file(tmp_path, tiny_model_dir, fixtures_dir, reference,
                                                                 caplog):
    config = config_for(tmp_path, tiny_model_dir, fixtures_dir)
    killed = train_script(config, *ARGS[2:], "--ckpt_path", "last", fault="SIGKILL@8")
    assert killed.returncode == -9, killed.stderr[-3000:]
    [best] = glob.glob(str(tmp_path / "runs" / "**" / "best-step6-*.ckpt"), recursive=True)
    now = time.time()
    os.utime(best, (now + 60, now + 60))  # the best checkpoint of step 6 is the newest file, last.ckpt is step 8
    assert finish_and_compare(tmp_path, config, reference, caplog) == ("last.ckpt", 8)


@pytest.mark.slow
def test_at_the_same_step_a_newer_best_checkpoint_gives_the_same_run(tmp_path, tiny_model_dir, fixtures_dir,
                                                                      reference, caplog):
    config = config_for(tmp_path, tiny_model_dir, fixtures_dir)
    killed = train_script(config, *ARGS[2:], "--ckpt_path", "last", fault="SIGKILL@6")
    assert killed.returncode == -9, killed.stderr[-3000:]
    [best] = glob.glob(str(tmp_path / "runs" / "**" / "best-step6-*.ckpt"), recursive=True)
    [last] = checkpoints(tmp_path, "last.ckpt")
    now = time.time()
    os.utime(best, (now + 60, now + 60))
    assert finish_and_compare(tmp_path, config, reference, caplog) == ("last.ckpt", 6)
    # resumed from the best file itself, the run is the same
    os.remove(last)
    for version in sorted(glob.glob(str(tmp_path / "runs" / "lightning_logs" / "version_*")))[1:]:
        for path in glob.glob(os.path.join(version, "checkpoints", "*.ckpt")):
            os.remove(path)
    lines = (tmp_path / "seen.jsonl").read_text().splitlines()
    (tmp_path / "seen.jsonl").write_text("".join(line + "\n" for line in lines[:6]))
    assert finish_and_compare(tmp_path, config, reference, caplog) == (os.path.basename(best), 6)
