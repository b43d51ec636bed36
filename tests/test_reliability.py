"""Reliability: a run survives being killed, preempted, a crash while writing a checkpoint, a
non-finite loss, a dead DDP rank and an unwritable output directory; bad input of every kind ends
with one clear line.

The faults are real: train.py subprocesses killed with SIGKILL or signalled mid-run (tests/faults.py
injects them at a chosen step). A save the operating system refuses (full disk, file-size limit)
and a resume on another number of devices are in tests/test_faults_real.py.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from lightning.fabric.utilities.data import _set_sampler_epoch
from torch.utils.data import DataLoader

import evaluate
import train
from datamodules.batching import SentenceBatchSampler
from encoders import hub
from harness.checkpoint import AtomicCheckpointIO, CheckpointError
from tests.conftest import ROOT
from tests.faults import FAULT_ENV
from tests.test_train import objective_config

FAST = ["--validate_first", "false"]


def run_config(root: Path, tiny: str, fixtures: Path, *, model: str = "STSRegression", model_args: dict | None = None,
               trainer: dict | None = None, record: bool = True) -> str:
    """The fixture STS regression run: 96 pairs in batches of 16 (6 steps per epoch), 10 steps,
    validation every 5; each step's examples appended to ``root/seen.jsonl`` when ``record``."""
    root.mkdir(parents=True, exist_ok=True)
    path = Path(objective_config(root, tiny, fixtures, "STSRegression", "STSDataModule",
                                 data_args={"per_device_batch_size": 16}, model_args=model_args or {}))
    config = yaml.safe_load(path.read_text())
    config["model"]["class_path"] = model if "." in model else f"lightning_modules.{model}"
    config["trainer"].update({"max_steps": 10, "val_check_interval": 5, **(trainer or {})})
    recorder = {"class_path": "tests.faults.RecordExamples", "init_args": {"path": str(root / "seen.jsonl")}}
    config["trainer"]["callbacks"] = [{"class_path": "tests.faults.SignalAtStep"}] + ([recorder] if record else [])
    path.write_text(yaml.safe_dump(config))
    return str(path)


def records(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "seen.jsonl").read_text().splitlines()]


def checkpoints(root: Path, name: str = "*.ckpt") -> list[str]:
    return sorted(glob.glob(str(root / "runs" / "lightning_logs" / "*" / "checkpoints" / name)))


def last_error_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def train_script(config: str, *args: str, fault: str | None = None, env: dict | None = None, timeout: int = 300):
    """``python train.py --config ...`` as a user runs it, with a fault armed (tests/faults.py). It computes with
    this process's torch thread count, so that its steps sum in the same order as a run made here (a matmul
    split over 2 threads differs from 1 thread in the last bits)."""
    extra = {**(env or {}), **({FAULT_ENV: fault} if fault else {})}
    threads = {"OMP_NUM_THREADS": str(torch.get_num_threads())}
    return subprocess.run([sys.executable, "train.py", "--config", config, *FAST, *args], cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **threads, **extra},
                          capture_output=True, text=True, timeout=timeout)


# -- the batch sampler's place in the epoch ------------------------------------------------------------
def test_sampler_state_round_trip_continues_the_epoch():
    lengths = list(range(50))
    sampler = SentenceBatchSampler(lengths, 4, seed=3, num_replicas=2, rank=1)
    it = iter(sampler)
    order = [next(it) for _ in range(5)] + list(it)
    state = sampler.state_dict(batches_done=3)  # a loader had read two batches ahead of training
    resumed = SentenceBatchSampler(lengths, 4, seed=3, num_replicas=2, rank=1)
    resumed.load_state_dict(state)
    assert list(resumed) == order[3:]
    resumed.load_state_dict(resumed.state_dict(batches_done=5))  # a second resume within the epoch
    assert list(resumed) == order[5:]

    at_end = SentenceBatchSampler(lengths, 4, seed=3, num_replicas=2, rank=1)
    at_end.load_state_dict({**state, "batches_done": len(sampler)})  # saved after the epoch's last batch
    sampler.set_epoch(1)
    assert at_end.epoch == 1 and list(at_end) == list(sampler) != order


def trained_examples(samplers: list[SentenceBatchSampler], batches: int) -> collections.Counter:
    """The examples every rank trains in its next ``batches`` batches."""
    seen: collections.Counter = collections.Counter()
    for sampler in samplers:
        it = iter(sampler)
        for _ in range(batches):
            seen.update(next(it))
    return seen


def ranks(size: int, world: int, n: int = 100) -> list[SentenceBatchSampler]:
    return [SentenceBatchSampler([0] * n, size, seed=3, num_replicas=world, rank=r) for r in range(world)]


@pytest.mark.parametrize("saved, resumed", [((16, 2), (16, 1)), ((16, 1), (16, 2)), ((5, 1), (7, 2)), ((7, 2), (3, 3))],
                         ids=["2-to-1", "1-to-2", "batch-5x1-to-7x2", "batch-7x2-to-3x3"])
def test_resume_on_other_devices_trains_the_rest_of_the_epoch_once(saved, resumed, caplog):
    n = 100
    for done in range(len(ranks(*saved)[0])):
        before = trained_examples(ranks(*saved), done)
        state = ranks(*saved)[0].state_dict(batches_done=done)
        caplog.clear()
        samplers = ranks(*resumed)
        for sampler in samplers:
            sampler.load_state_dict(state)
        assert [r.getMessage().startswith("resuming on ") for r in caplog.records] == [True]  # rank 0 only
        rest = [b for b in zip(*samplers)]  # one global step: every rank's share
        assert all(len({len(share) for share in step}) == 1 for step in rest)  # equal shares on every rank
        seen = before + collections.Counter(i for step in rest for share in step for i in share)
        assert set(seen) == set(range(n)), f"skipped after {done} batches"
        # repeats only where the last batch is completed to a multiple of the device count
        assert sum(seen.values()) - n < resumed[1], f"repeated after {done} batches"
        # Lightning's count of the epoch's batches: the placeholders in front, then the rest
        assert samplers[0].resumed_batches_done + len(rest) == len(samplers[0]) == len(ranks(*resumed)[0])


def test_second_resume_within_a_reexpressed_epoch(caplog):
    n = 100
    first = trained_examples(ranks(16, 2), 1)  # 32 examples on two devices
    [one] = ranks(16, 1)
    one.load_state_dict(ranks(16, 2)[0].state_dict(batches_done=1))
    it = iter(one)
    second = collections.Counter(i for _ in range(2) for i in next(it))  # 32 more on one device
    state = one.state_dict(batches_done=one.resumed_batches_done + 2)
    for world in (1, 2):  # the same settings again, or back to two devices
        samplers = ranks(16, world)
        for sampler in samplers:
            sampler.load_state_dict(state)
        rest = collections.Counter(i for sampler in samplers for batch in sampler for i in batch)
        seen = first + second + rest
        assert set(seen) == set(range(n)) and sum(seen.values()) - n < world, world


def test_lightning_sets_the_epoch_of_the_batch_sampler():
    # Lightning calls set_epoch on loader.batch_sampler.sampler only; before this was reached,
    # every epoch repeated the first one's order.
    sampler = SentenceBatchSampler(list(range(40)), 4, seed=0)
    first = list(sampler)
    _set_sampler_epoch(DataLoader(range(40), batch_sampler=sampler), 1)
    assert sampler.epoch == 1 and list(sampler) != first


# -- 1. killed mid-epoch, resumed --------------------------------------------------------------------------
def contributing_examples(root: Path, resumed_from: list[int]) -> list[dict]:
    """The steps that reached the final weights: each killed run's up to the checkpoint the next run resumed from."""
    runs = collections.defaultdict(list)
    for line in records(root):
        runs[line["pid"]].append(line)
    ordered = sorted(runs.values(), key=lambda r: r[0]["time"])
    assert len(ordered) == len(resumed_from) + 1
    kept = [line for run, last in zip(ordered, resumed_from) for line in run if line["step"] <= last]
    return kept + ordered[-1]


def by_epoch(lines: list[dict]) -> dict[int, collections.Counter]:
    epochs: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in lines:
        epochs[line["epoch"]].update(line["rows"])
    return dict(epochs)


@pytest.mark.slow
def test_killed_run_resumed_twice_sees_every_example_once_and_ends_identical(tmp_path, tiny_model_dir,
                                                                             fixtures_dir, caplog):
    # last.ckpt every 2 steps (and after validation, every 5); 12 steps = 2 epochs. SIGKILL when
    # 3 steps are done (the next run resumes from step 2, mid-epoch 0, and redoes step 3), then
    # when 7 are done (it resumes from step 6, the end of epoch 0). One command line throughout,
    # as in a requeued job: --ckpt_path last.
    args = [*FAST, "--last_checkpoint.every_n_train_steps", "2", "--trainer.max_steps", "12"]
    reference = tmp_path / "reference"
    train.main(["--config", run_config(reference, tiny_model_dir, fixtures_dir), *args])

    root = tmp_path / "killed"
    config = run_config(root, tiny_model_dir, fixtures_dir)
    outputs = []
    for fault in ("SIGKILL@3", "SIGKILL@7"):
        result = train_script(config, *args, "--ckpt_path", "last", fault=fault)
        assert result.returncode == -9, result.stderr[-3000:]
        outputs.append(result.stdout + result.stderr)
    caplog.clear()
    train.main(["--config", config, *args, "--ckpt_path", "last"])  # the last one runs to the end, here
    outputs.append(caplog.text)
    assert "--ckpt_path last: no checkpoint under" in outputs[0]
    resumed = [re.findall(r"--ckpt_path last: resuming from \S+ \(step (\d+)\)", out) for out in outputs[1:]]
    assert resumed == [["2"], ["6"]]

    expected, seen = records(reference), contributing_examples(root, resumed_from=[2, 6])
    assert [line["step"] for line in seen] == list(range(1, 13))
    assert [line["rows"] for line in seen] == [line["rows"] for line in expected]  # same batches, same order
    epochs = by_epoch(seen)
    assert epochs == by_epoch(expected) and sum(epochs[0].values()) == 96  # every example once per epoch
    assert expected[0]["rows"] != expected[6]["rows"], "epoch 1 must not repeat epoch 0's order"

    ref_ckpt = torch.load(checkpoints(reference, "last.ckpt")[-1], weights_only=True)
    final_ckpt = torch.load(max(checkpoints(root, "last.ckpt"), key=os.path.getmtime), weights_only=True)
    assert ref_ckpt["global_step"] == final_ckpt["global_step"] == 12
    for key, value in ref_ckpt["state_dict"].items():  # fp32, same seed: the same weights
        # fp32 tolerance: CPU kernels may reduce in another order when the machine is loaded
        torch.testing.assert_close(final_ckpt["state_dict"][key], value, rtol=1e-4, atol=1e-5, msg=key)


# -- 2. preemption signals -------------------------------------------------------------------------------
def test_sigterm_saves_the_step_in_flight_and_exits_zero(tmp_path, tiny_model_dir, fixtures_dir):
    config = run_config(tmp_path, tiny_model_dir, fixtures_dir, record=False)
    result = train_script(config, fault="SIGTERM@3")  # arrives during the 4th step
    assert result.returncode == 0, result.stderr[-3000:]
    [last] = checkpoints(tmp_path, "last.ckpt")
    assert f"preempted (SIGTERM) after step 4: saved {last}; resume with --ckpt_path last" in result.stderr
    assert torch.load(last, weights_only=True)["global_step"] == 4


# SIGUSR1 under a real scheduler (the save, the requeue and the resumed job): tests/test_slurm.py


# -- 3. killed while writing a checkpoint (a full disk and a file-size limit: tests/test_faults_real.py) -----
def test_resume_last_skips_a_truncated_newest_checkpoint(trained, tmp_path, caplog):
    runs = tmp_path / "runs" / "lightning_logs"
    good = runs / "version_0" / "checkpoints" / "last.ckpt"
    good.parent.mkdir(parents=True)
    good.write_bytes(Path(trained["last"]).read_bytes())
    torn = runs / "version_1" / "checkpoints" / "last.ckpt"  # a copy interrupted by a crash, newer
    torn.parent.mkdir(parents=True)
    torn.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (torn.parent / "last.ckpt.tmp").write_bytes(b"PK\x03\x04 killed while writing")
    os.utime(good, (time.time() - 60, time.time() - 60))
    cli = train.main(["--config", trained["config"], *FAST, "--trainer.default_root_dir", str(tmp_path / "runs"),
                      "--trainer.max_steps", "6", "--ckpt_path", "last"])
    assert cli.trainer.global_step == 6
    assert f"skipping an unreadable checkpoint: {torn}: not a readable checkpoint" in caplog.text
    assert f"--ckpt_path last: resuming from {good} (step 4)" in caplog.text


class Payload:
    """Stands for any pickled object, whose unpickling could run code."""


def test_checkpoints_load_weights_only_whatever_the_caller_asks(tmp_path):
    path = tmp_path / "pickle.ckpt"
    torch.save({"state_dict": {}, "payload": Payload()}, path)
    with pytest.raises(CheckpointError, match="it holds a pickled tests.test_reliability.Payload, and pickled objects"):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)


# -- 4. non-finite loss ------------------------------------------------------------------------------------
def test_nonfinite_loss_stops_with_where_why_and_the_last_finite_state(tmp_path, tiny_model_dir, fixtures_dir,
                                                                         capsys):
    config = run_config(tmp_path, tiny_model_dir, fixtures_dir, record=False, model="tests.faults.NonFiniteAtStep",
                        model_args={"bad_step": 3})
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", config, *FAST, "--last_checkpoint.every_n_train_steps", "3"])
    [saved] = checkpoints(tmp_path, "nonfinite-step3.ckpt")
    assert exit_info.value.code == 3
    line = last_error_line(capsys)
    assert line.startswith("error: non-finite loss nan at step 3 (epoch 0); logged: loss=nan, mse_part=nan; lr=")
    assert line.endswith(f"The last finite state is saved in {saved}")
    state = torch.load(saved, weights_only=True)
    assert state["global_step"] == 3
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())
    # the same weights as the last.ckpt written after step 3: nothing of step 4 reached them
    [last] = checkpoints(tmp_path, "last.ckpt")
    for key, value in torch.load(last, weights_only=True)["state_dict"].items():
        torch.testing.assert_close(state["state_dict"][key], value, rtol=0, atol=0)


# -- 5. a DDP rank dies ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 0], ids=["worker-dies", "rank0-dies"])
def test_dead_ddp_rank_ends_the_whole_job(tmp_path, tiny_model_dir, fixtures_dir, rank):
    config = run_config(tmp_path, tiny_model_dir, fixtures_dir)
    result = train_script(config, "--trainer.strategy", "ddp", "--trainer.devices", "2", "--ddp_timeout_minutes", "2",
                          fault=f"SIGKILL@2:{rank}", timeout=420)
    ended = time.time()  # subprocess.run returns when every process holding its output has exited
    assert result.returncode != 0
    kill_time = max(line["time"] for line in records(tmp_path))
    assert ended - kill_time < 150, f"the surviving rank took {ended - kill_time:.0f} s to give up"


# -- 6. an output directory that cannot be written -------------------------------------------------------------
def test_unwritable_output_directory_fails_at_start_up(tmp_path, tiny_model_dir, fixtures_dir, capsys):
    config = run_config(tmp_path, tiny_model_dir, fixtures_dir, record=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", config, "--trainer.default_root_dir", str(blocker / "runs")])
    assert exit_info.value.code == 2
    assert last_error_line(capsys) == f"error: {blocker / 'runs'}: the run's output directory is not writable: " \
                                      "Not a directory"


# -- bad input: one line naming the file and line, or the key; exit 2 --------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir, fixtures_dir) -> dict:
    """A 4-step run of the fixture config: its config and last.ckpt."""
    root = tmp_path_factory.mktemp("trained")
    config = run_config(root, tiny_model_dir, fixtures_dir, record=False, trainer={"max_steps": 4})
    cli = train.main(["--config", config, *FAST])
    return {"config": config, "last": cli.trainer.checkpoint_callback.last_model_path}


STS_HEADER = "sentence1\tsentence2\tscore\n"


@pytest.mark.parametrize("content, message", [
    (b"", "{path}: the data file is empty"),
    (b"premise\thypothesis\tlabel\na\tb\tentailment\n",
     "{path}:1: missing column(s) ['sentence1', 'sentence2', 'score']; "
     "the header has ['premise', 'hypothesis', 'label']"),
    ((STS_HEADER + "a\tb\t3\nc\td\t5.5\n").encode(), "{path}:3: score '5.5' is outside the range [0, 5]"),
], ids=["empty-file", "other-columns", "score-out-of-range"])
def test_bad_training_file(trained, tmp_path, capsys, content, message):
    path = tmp_path / "train.tsv"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", trained["config"], *FAST, "--trainer.default_root_dir", str(tmp_path / "runs"),
                    "--data.init_args.train_source", str(path)])
    assert exit_info.value.code == 2
    assert last_error_line(capsys) == "error: " + message.format(path=path)


def test_bom_and_windows_line_ends_train_like_the_plain_file(trained, tmp_path, fixtures_dir):
    plain = (fixtures_dir / "sts" / "stsb.train.tsv").read_text(encoding="utf-8")
    path = tmp_path / "windows.tsv"
    path.write_bytes(b"\xef\xbb\xbf" + plain.replace("\n", "\r\n").encode("utf-8"))
    cli = train.main(["--config", trained["config"], *FAST, "--trainer.default_root_dir", str(tmp_path / "runs"),
                      "--trainer.max_steps", "1", "--data.init_args.train_source", str(path)])
    assert cli.trainer.global_step == 1 and len(cli.datamodule.train_dataset) == len(plain.splitlines()) - 1


@pytest.mark.parametrize("override, message", [
    (["--model.init_args.encoder.init_args.mlp_head", "true"],
     "mlp_head applies on top of cls pooling, but pooling is 'mean'"),
    (["--model.init_args.encoder.init_args.model_name", "./nope"], "no such model directory: ./nope"),
    (["--model.init_args.warmup_ratio", "1.5"], "warmup_ratio must be in [0, 1), got 1.5"),
], ids=["mlp-head-with-mean-pooling", "missing-model-dir", "bad-warmup"])
def test_refused_arguments_give_one_line_not_the_union_report(trained, capsys, override, message):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", trained["config"], *FAST, *override])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"error: {message}" and "Union" not in err


def test_offline_model_with_the_wrong_hash(trained, monkeypatch, capsys):
    monkeypatch.setattr(hub, "sha256_of", lambda path: "0" * 64)
    hub.verified_offline_copy.cache_clear()
    try:
        with pytest.raises(SystemExit) as exit_info:
            train.main(["--config", trained["config"], *FAST,
                        "--model.init_args.encoder.init_args.model_name", "sentence-transformers/all-MiniLM-L6-v2"])
    finally:
        hub.verified_offline_copy.cache_clear()
    line = last_error_line(capsys)
    assert exit_info.value.code == 2 and line.startswith("error: offline model weights ")
    assert f"have sha256 {'0' * 64}, expected {hub.OFFLINE_MODEL_SHA256}" in line


def other_objective(trained, tmp_path) -> Path:
    checkpoint = torch.load(trained["last"], weights_only=True)
    checkpoint["objective"] = "lightning_modules.nli_softmax.NLISoftmax"
    path = tmp_path / "nli.ckpt"
    torch.save(checkpoint, path)
    return path


def truncated(trained, tmp_path) -> Path:
    path = tmp_path / "torn.ckpt"
    data = Path(trained["last"]).read_bytes()
    path.write_bytes(data[: len(data) // 3])
    return path


def text_file(trained, tmp_path) -> Path:
    path = tmp_path / "notes.ckpt"
    path.write_text("not a checkpoint\n")
    return path


@pytest.mark.parametrize("make, message", [
    (other_objective, "{path}: a checkpoint of lightning_modules.nli_softmax.NLISoftmax, but this run trains "
                      "lightning_modules.sts_regression.STSRegression; resume with the config it was trained with "
                      "(its config.yaml)"),
    (truncated, "{path}: not a readable checkpoint (truncated or another format): "),
    (text_file, "{path}: not a readable checkpoint (truncated or another format): "),
    (lambda trained, tmp_path: tmp_path / "missing.ckpt", "{path}: checkpoint file not found"),
], ids=["another-objective", "truncated", "not-a-checkpoint", "missing"])
def test_bad_checkpoint_to_resume_fails_before_training(trained, tmp_path, capsys, make, message):
    path = make(trained, tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", trained["config"], *FAST, "--trainer.default_root_dir", str(tmp_path / "runs"),
                    "--ckpt_path", str(path)])
    assert exit_info.value.code == 2
    assert last_error_line(capsys).startswith("error: " + message.format(path=path))
    assert not glob.glob(str(tmp_path / "runs" / "**" / "*.ckpt"), recursive=True)


@pytest.mark.parametrize("args, message", [
    (lambda trained, tmp_path: {"ckpt_path": str(truncated(trained, tmp_path))},
     "not a readable checkpoint (truncated or another format)"),
    (lambda trained, tmp_path: {"ckpt_path": trained["last"], "model": "sentence-transformers/all-MiniLM-L6-v2"},
     "give exactly one of --ckpt_path and --model"),
], ids=["truncated", "ckpt-and-model"])
def test_evaluate_bad_arguments(trained, tmp_path, fixtures_dir, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        evaluate.evaluate(sts_dir=str(fixtures_dir / "sts"), **args(trained, tmp_path))
    assert exit_info.value.code == 2 and message in last_error_line(capsys)
