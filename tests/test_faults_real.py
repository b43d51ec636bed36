"""Faults as a user's job meets them: a checkpoint that the operating system refuses to write, and a
run resumed on another number of devices.

The file-size test runs train.py under ``RLIMIT_FSIZE``, so ``write()`` fails with the operating
system's own error inside torch's zip writer, as on a full disk; the device-count tests stop real
two-process CPU DDP runs (gloo) and one-process runs mid-epoch and resume them on the other count.
"""
from __future__ import annotations

import collections
import glob
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from harness import checkpoint as checkpoint_module
from harness.checkpoint import AtomicCheckpointIO, CheckpointWriteError
from harness.cli import SentenceCLI
from tests.conftest import ROOT
from tests.faults import row_fingerprints
from tests.test_reliability import FAST, checkpoints, records, run_config, train_script


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


# -- a checkpoint the operating system refuses ------------------------------------------------------------
def test_full_disk_names_the_file_and_the_reason_and_keeps_the_previous_checkpoint(tmp_path):
    # /dev/full answers every write with ENOSPC, as a full disk does; the temporary file is a link to it.
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"w": torch.zeros(4)}, path)
    before = path.read_bytes()
    os.symlink("/dev/full", f"{path}.tmp")
    with pytest.raises(CheckpointWriteError) as info:
        io.save_checkpoint({"w": torch.ones(1 << 16)}, path)
    assert str(info.value) == f"cannot write checkpoint {path}: No space left on device"
    assert path.read_bytes() == before and not os.path.lexists(f"{path}.tmp")


def file_size_limit(limit: int):
    """For ``preexec_fn``: files of this process may not grow past ``limit`` bytes. SIGXFSZ, which
    would kill it, is ignored, so ``write()`` fails with EFBIG ("File too large") instead."""
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.slow
def test_save_past_the_file_size_limit_ends_with_one_line_and_the_run_resumes(tmp_path, tiny_model_dir, fixtures_dir,
                                                                              monkeypatch, capsys):
    args = [*FAST, "--last_checkpoint.every_n_train_steps", "2"]
    reference = tmp_path / "reference"
    uninterrupted = train.main(["--config", run_config(reference, tiny_model_dir, fixtures_dir, record=False,
                                                       trainer={"max_steps": 4}), *args])

    root = tmp_path / "limited"
    config = run_config(root, tiny_model_dir, fixtures_dir, record=False, trainer={"max_steps": 4})
    # 0. A disk with less free space than one checkpoint: refused at set-up, before any step.
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint_module.shutil, "disk_usage", lambda path: usage(1 << 20, 0, 1 << 20))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", config, *args])
    monkeypatch.undo()
    line = capsys.readouterr().err.strip().splitlines()[-1]
    needed = re.fullmatch(rf"error: {re.escape(str(root / 'runs'))}: 1\.0 MiB free, but a checkpoint of this model "
                          r"needs about ([\d.]+) MiB; free at least ([\d.]+) MiB there", line)
    assert exit_info.value.code == 2 and needed, line
    assert not checkpoints(root)

    # 1. Killed as step 3 starts: last.ckpt of step 2 is the checkpoint that must survive.
    killed = train_script(config, *args[2:], "--ckpt_path", "last", fault="SIGKILL@2")
    assert killed.returncode == -9, killed.stderr[-3000:]
    [previous] = checkpoints(root, "last.ckpt")
    saved = Path(previous).read_bytes()
    assert torch.load(previous, weights_only=True)["global_step"] == 2
    # the start-up check's figure is the size of a real checkpoint of this model
    assert abs(float(needed.group(1)) * 2 ** 20 / len(saved) - 1) < 0.05, (needed.group(1), len(saved))
    assert abs(checkpoint_module.checkpoint_size(uninterrupted.model) / len(saved) - 1) < 0.05

    # 2. Resumed where no file may reach half a checkpoint: its save at step 4 fails in write().
    result = subprocess.run(
        [sys.executable, "train.py", "--config", config, *args, "--ckpt_path", "last"], cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300, preexec_fn=file_size_limit(len(saved) // 2))
    newest = max(glob.glob(str(root / "runs" / "lightning_logs" / "version_*")), key=lambda d: int(d.rsplit("_", 1)[1]))
    failed = os.path.join(newest, "checkpoints", "last.ckpt")  # the resumed run's own directory
    assert result.returncode == 3, result.stderr[-3000:]
    assert error_lines(result.stderr) == [f"error: cannot write checkpoint {failed}: File too large"]
    assert result.stderr.strip().splitlines()[-1] == error_lines(result.stderr)[0]
    assert "Traceback" not in result.stderr and "inline_container" not in result.stderr
    assert checkpoints(root, "last.ckpt") == [previous] and Path(previous).read_bytes() == saved
    assert not glob.glob(str(root / "**" / "*.tmp"), recursive=True)

    # 3. Resumed with room: it ends with the weights of the uninterrupted run.
    cli = train.main(["--config", config, *args, "--ckpt_path", "last"])
    assert cli.trainer.global_step == 4
    final = torch.load(cli.trainer.checkpoint_callback.last_model_path, weights_only=True)
    expected = torch.load(checkpoints(reference, "last.ckpt")[-1], weights_only=True)
    assert final["global_step"] == expected["global_step"] == 4
    for key, value in expected["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, rtol=1e-4, atol=1e-5, msg=key)


# -- resumed on another number of devices ----------------------------------------------------------------
# The fixture STS data: 96 pairs, 16 per device and step: 6 steps an epoch on one process, 3 on two.
EXAMPLES, PER_DEVICE, LR = 96, 16, 1e-3
DDP = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--ddp_timeout_minutes", "2"]


def device_config(root: Path, tiny: str, fixtures: Path, max_steps: int) -> str:
    # warmup_ratio 0.34: one or two warmup steps, then the linear decay to max_steps
    return run_config(root, tiny, fixtures, model_args={"lr": LR, "warmup_ratio": 0.34},
                      trainer={"max_steps": max_steps, "val_check_interval": 100})


def linear_schedule(step: int, total: int) -> float:
    """The rate after ``step`` optimizer steps: linear warmup over int(0.34 * total) steps, then linear decay."""
    warmup = int(0.34 * total)
    return LR * (step / warmup if step < warmup else (total - step) / (total - warmup))


def steps_of(lines: list[dict]) -> dict[int, dict]:
    """Per global step (every rank's line merged): its epoch, world size, examples and learning rate."""
    steps: dict[int, dict] = {}
    for line in lines:
        step = steps.setdefault(line["step"], {"epoch": line["epoch"], "world": line["world"], "rows": [],
                                               "lr": line["lr"]})
        assert (step["epoch"], step["world"], step["lr"]) == (line["epoch"], line["world"], line["lr"])
        step["rows"] += line["rows"]
    return steps


def every_example(config: str) -> collections.Counter:
    """The fingerprints of the config's training rows, each as often as the data holds it (the fixture
    repeats a few pairs), read through the data module's own loader."""
    cli = SentenceCLI(args=["--config", config])
    cli.datamodule.setup("fit")
    prints = collections.Counter(row for batch in cli.datamodule.train_dataloader() for row in row_fingerprints(batch))
    assert sum(prints.values()) == EXAMPLES
    return prints


def check_resumed_epoch(root: Path, config: str, saved_steps: list[int], max_steps: int,
                        sizes_after: list[int]) -> None:
    """Every example of epoch 0 once over the stopped runs (each to the checkpoint the next resumed
    from) and the last run; steps numbered on from each checkpoint, the last run's with ``sizes_after``
    examples each; the learning rate on the schedule of ``max_steps`` throughout."""
    by_pid = collections.defaultdict(list)
    for line in records(root):
        by_pid[line["pid"]].append(line)
    processes = sorted(by_pid.values(), key=lambda lines: lines[0]["time"])  # each run's ranks, run after run
    runs = []
    while processes:
        world = processes[0][0]["world"]
        runs.append([line for lines in processes[:world] for line in lines])
        processes = processes[world:]
    assert len(runs) == len(saved_steps) + 1
    steps, start = {}, 0
    for run, end in zip(runs, [*saved_steps, max_steps]):
        kept = steps_of([line for line in run if line["step"] <= end])
        assert sorted(kept) == list(range(start + 1, end + 1))
        steps.update(kept)
        start = end
    epoch0 = collections.Counter(row for s in steps.values() if s["epoch"] == 0 for row in s["rows"])
    assert epoch0 == every_example(config), "epoch 0 saw an example twice or skipped one"
    assert [len(steps[s]["rows"]) for s in range(saved_steps[-1] + 1, max_steps + 1)] == sizes_after
    for step, values in steps.items():
        assert values["lr"] == pytest.approx(linear_schedule(step, max_steps), rel=1e-6, abs=1e-12), step


@pytest.mark.slow
def test_two_process_run_stopped_mid_epoch_resumes_on_one(tmp_path, tiny_model_dir, fixtures_dir, caplog):
    config = device_config(tmp_path, tiny_model_dir, fixtures_dir, max_steps=5)
    every_step = ["--last_checkpoint.every_n_train_steps", "1"]
    # SIGUSR1 (SLURM's warning before the time limit) during step 2: both ranks save after it,
    # when 64 of epoch 0's 96 examples are trained.
    first = train_script(config, *DDP, "--ckpt_path", "last", fault="SIGUSR1@1", timeout=420)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "preempted (SIGUSR1) after step 2" in first.stderr
    # On one process, killed again as step 4 starts (last.ckpt of step 3, 16 more examples), then
    # resumed on one process: a second resume within the re-expressed epoch.
    second = train_script(config, *every_step, "--ckpt_path", "last", fault="SIGKILL@3")
    assert second.returncode == -9, second.stderr[-3000:]
    out = second.stdout + second.stderr
    assert re.search(r"--ckpt_path last: resuming from \S+ \(step 2\)", out)
    assert re.findall(r"resuming on .*", out) == [
        "resuming on 1 device(s) with 16 examples per device and step; the checkpoint was saved on 2 with 16: "
        "epoch 0 continues with the 32 examples it has not trained on, in this run's batches; steps and the "
        "learning-rate schedule continue from the checkpoint's step"]
    caplog.clear()
    cli = train.main(["--config", config, *FAST, *every_step, "--ckpt_path", "last"])
    assert re.search(r"--ckpt_path last: resuming from \S+ \(step 3\)", caplog.text)
    assert "resuming on " not in caplog.text  # the same device count as the checkpoint's: no warning
    assert cli.trainer.global_step == 5
    # steps 3 and 4 finish epoch 0 with 16 examples each; step 5 starts epoch 1
    check_resumed_epoch(tmp_path, config, saved_steps=[2, 3], max_steps=5, sizes_after=[16, 16])
    assert [line["epoch"] for line in records(tmp_path) if line["step"] == 5] == [1]


@pytest.mark.slow
def test_one_process_run_killed_mid_epoch_resumes_on_two(tmp_path, tiny_model_dir, fixtures_dir):
    config = device_config(tmp_path, tiny_model_dir, fixtures_dir, max_steps=5)
    every_step = ["--last_checkpoint.every_n_train_steps", "1"]
    # SIGKILL as step 3 starts: last.ckpt holds step 2, 32 of epoch 0's examples. Lightning restores
    # "2 of the epoch's 3 batches"; in two-device batches the 32 examples are 1 of them.
    first = train_script(config, *every_step, "--ckpt_path", "last", fault="SIGKILL@2")
    assert first.returncode == -9, first.stderr[-3000:]
    second = train_script(config, *every_step, *DDP, "--ckpt_path", "last", timeout=420)
    assert second.returncode == 0, second.stderr[-3000:]
    out = second.stdout + second.stderr
    assert re.search(r"--ckpt_path last: resuming from \S+ \(step 2\)", out)
    assert out.count("resuming on ") == 1  # rank 0 warns for the job
    assert ("resuming on 2 device(s) with 16 examples per device and step; the checkpoint was saved on 1 with 16: "
            "epoch 0 continues with the 64 examples it has not trained on, in this run's batches") in out
    # steps 3 and 4 finish epoch 0 with 32 examples each; step 5 starts epoch 1
    check_resumed_epoch(tmp_path, config, saved_steps=[2], max_steps=5, sizes_after=[32, 32, 32])
    assert {line["epoch"] for line in records(tmp_path) if line["step"] == 5} == {1}
    final = torch.load(max(checkpoints(tmp_path, "last.ckpt"), key=os.path.getmtime), weights_only=True)
    assert final["global_step"] == 5
