"""SLURM on a real scheduler: the shipped sbatch script as a 2-rank DDP job on CPU, preemption by SIGUSR1 with a
requeue and an exact resume, scancel, a job requeued with another task count, and a grid as a job array.

The cluster is the single-node one of ``slurm/local_cluster.sh`` (``.ci/run`` brings it up; this module brings it
up itself when it can and takes down only what it started). Where no scheduler can run (not root, no
packages), the module is skipped with one line."""
from __future__ import annotations

import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import ROOT
from tests.test_reliability import run_config

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

STEPS = 24  # 96 fixture pairs, 16 per rank and step: 3 steps an epoch on 2 ranks


def _cluster_conf() -> tuple[str | None, bool, str]:
    """(SLURM_CONF of a working cluster, whether this module started it, why not)."""
    conf = os.environ.get("SLURM_CONF")
    if conf and shutil.which("sinfo") and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0:
        return conf, False, ""
    if os.geteuid() != 0:
        return None, False, "not root, and no running cluster in SLURM_CONF"
    up = subprocess.run(["bash", str(ROOT / "slurm" / "local_cluster.sh"), "up"], capture_output=True, text=True)
    found = re.search(r"export SLURM_CONF=(\S+)", up.stdout)
    if up.returncode != 0 or not found:
        return None, False, f"slurm/local_cluster.sh up failed: {(up.stderr or up.stdout).strip()[-300:]}"
    return found.group(1), "already up" not in up.stderr, ""


@pytest.fixture(scope="module")
def cluster():
    conf, started, why = _cluster_conf()
    if conf is None:
        pytest.skip(f"no SLURM scheduler here: {why}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    if started:
        subprocess.run(["bash", str(ROOT / "slurm" / "local_cluster.sh"), "down"], capture_output=True)
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous


def job_env() -> dict:
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("SENTEMB_TEST_FAULT", None)
    return env


def submit(*args: str) -> str:
    result = subprocess.run(["sbatch", "--parsable", *args], cwd=ROOT, env=job_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job(job_id: str) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def wait_for(condition, timeout: float, what: str, poll: float = 0.3):
    start = time.time()
    while time.time() - start < timeout:
        found = condition()
        if found:
            return found
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_state(job_id: str, states: tuple[str, ...], timeout: float = 240) -> dict[str, str]:
    return wait_for(lambda: (info := job(job_id)).get("JobState") in states and info, timeout,
                    f"job {job_id} to reach {states} (now {job(job_id).get('JobState')})")


def steps_seen(root: Path) -> list[dict]:
    path = root / "seen.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train_config(root: Path, tiny: str, fixtures: Path) -> str:
    """The fixture STS regression run, fp32, 24 steps with validation at each epoch's end, a short sleep after
    each step (so a signal from outside lands inside training), every step's examples recorded."""
    config = run_config(root, tiny, fixtures, trainer={"max_steps": STEPS, "val_check_interval": 1.0,
                                                       "check_val_every_n_epoch": 1, "precision": "32"})
    data = yaml.safe_load(Path(config).read_text())
    data["trainer"]["callbacks"].append({"class_path": "tests.faults.SlowSteps", "init_args": {"seconds": 0.3}})
    Path(config).write_text(yaml.safe_dump(data))
    return config


def sbatch_train(root: Path, config: str, *sbatch: str) -> str:
    return submit(*sbatch, f"--output={root}/slurm-%j.out", "slurm/train.sbatch", "--config", config,
                  "--validate_first", "false", "--trainer.default_root_dir", str(root / "runs"))


def final_weights(root: Path) -> tuple[int, dict]:
    path = max(glob.glob(str(root / "runs" / "lightning_logs" / "*" / "checkpoints" / "last.ckpt")),
               key=os.path.getmtime)
    ckpt = torch.load(path, weights_only=True)
    return ckpt["global_step"], ckpt["state_dict"]


def log_of(root: Path, job_id: str) -> str:
    return (root / f"slurm-{job_id}.out").read_text()


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory, tiny_model_dir, fixtures_dir) -> dict:
    root = tmp_path_factory.mktemp("slurm-uninterrupted")
    job_id = sbatch_train(root, train_config(root, tiny_model_dir, fixtures_dir))
    info = wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))
    return {"root": root, "job": job_id, "info": info, "final": final_weights(root) if info["JobState"] ==
            "COMPLETED" else None}


def assert_same_weights(found: tuple[int, dict], expected: tuple[int, dict]) -> None:
    assert found[0] == expected[0] == STEPS
    differences = {k: (found[1][k] - v).abs().max().item() for k, v in expected[1].items()}
    assert max(differences.values()) == 0.0, {k: d for k, d in differences.items() if d}


def test_the_sbatch_script_runs_two_ddp_ranks_on_cpu_nodes(uninterrupted):
    log = log_of(uninterrupted["root"], uninterrupted["job"])
    assert uninterrupted["info"]["JobState"] == "COMPLETED", log[-3000:]
    assert uninterrupted["info"]["ExitCode"] == "0:0"
    assert f"job {uninterrupted['job']} (restart 0): 1 node(s) x 2 task(s) on cpu" in log
    assert "distributed_backend=gloo" in log and "Starting with 2 processes" in log
    seen = steps_seen(uninterrupted["root"])
    assert {s["rank"] for s in seen} == {0, 1} and {s["world"] for s in seen} == {2}
    assert "gres" not in log.lower()  # no generic resource asked for on CPU nodes


def test_sigusr1_saves_requeues_and_the_job_resumes_to_the_uninterrupted_weights(uninterrupted, tmp_path,
                                                                                  tiny_model_dir, fixtures_dir):
    job_id = sbatch_train(tmp_path, train_config(tmp_path, tiny_model_dir, fixtures_dir))
    wait_for(lambda: len(steps_seen(tmp_path)) >= 4, 120, "two training steps")
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True)  # what --signal=USR1@90 does before the limit
    info = wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))
    log = log_of(tmp_path, job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log[-3000:]
    saved = re.search(rf"preempted \(SIGUSR1\) after step (\d+): saved (\S+); requeued SLURM job {job_id}", log)
    assert saved, log[-3000:]
    assert f"job {job_id} (restart 1): 1 node(s) x 2 task(s) on cpu" in log
    assert f"--ckpt_path last: resuming from {saved.group(2)} (step {saved.group(1)})" in log
    assert_same_weights(final_weights(tmp_path), uninterrupted["final"])


def test_scancel_ends_the_job_with_a_resumable_checkpoint(uninterrupted, tmp_path, tiny_model_dir, fixtures_dir):
    config = train_config(tmp_path, tiny_model_dir, fixtures_dir)
    job_id = sbatch_train(tmp_path, config)
    wait_for(lambda: len(steps_seen(tmp_path)) >= 4, 120, "two training steps")
    subprocess.run(["scancel", job_id], check=True)
    wait_state(job_id, ("CANCELLED", "COMPLETED", "FAILED"))
    wait_for(lambda: "preempted (SIGTERM)" in log_of(tmp_path, job_id), 60, "the SIGTERM save's line")
    wait_for(lambda: not subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip(),
             60, f"job {job_id} to leave the queue")
    info, log = job(job_id), log_of(tmp_path, job_id)
    # docs/CLUSTER.md: the job ends CANCELLED with exit code 0:0: every rank finished its step, saved and
    # exited 0 before SLURM's KillWait ran out (no rank was killed); a cancelled job is not requeued
    assert info["JobState"] == "CANCELLED" and info["ExitCode"] == "0:0" and info["Restarts"] == "0"
    assert "srun: error" not in log and f"*** JOB {job_id} ON" in log
    saved = re.search(r"preempted \(SIGTERM\) after step (\d+): saved (\S+); resume with --ckpt_path last", log)
    assert saved, log[-3000:]
    assert torch.load(saved.group(2), weights_only=True)["global_step"] == int(saved.group(1))
    again = sbatch_train(tmp_path, config)  # a new job, the same command: it resumes
    assert wait_state(again, ("COMPLETED", "FAILED", "CANCELLED"))["JobState"] == "COMPLETED"
    assert f"--ckpt_path last: resuming from {saved.group(2)} (step {saved.group(1)})" in log_of(tmp_path, again)
    assert_same_weights(final_weights(tmp_path), uninterrupted["final"])


def test_a_job_requeued_with_one_task_continues_its_epoch_on_one_rank(cluster, tmp_path, tiny_model_dir,
                                                                      fixtures_dir):
    job_id = sbatch_train(tmp_path, train_config(tmp_path, tiny_model_dir, fixtures_dir))
    wait_for(lambda: len(steps_seen(tmp_path)) >= 2, 120, "a training step")
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
    wait_state(job_id, ("PENDING",), timeout=120)  # requeued: it may not start before its credential expires
    subprocess.run(["scontrol", "hold", job_id], check=True)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "NumTasks=1", "TasksPerNode=1"], check=True)
    subprocess.run(["scontrol", "release", job_id], check=True)
    info = wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))
    log = log_of(tmp_path, job_id)
    assert info["JobState"] == "COMPLETED", log[-3000:]
    stopped = int(re.search(r"preempted \(SIGUSR1\) after step (\d+)", log).group(1))
    assert f"job {job_id} (restart 1): 1 node(s) x 1 task(s) on cpu" in log
    # docs/RELIABILITY.md's rule for another device count: the epoch goes on with the examples it has not seen
    assert "resuming on 1 device(s) with 16 examples per device and step; the checkpoint was saved on 2 with 16" in log
    seen = steps_seen(tmp_path)
    first = [s for s in seen if s["world"] == 2 and s["step"] <= stopped]
    second = [s for s in seen if s["world"] == 1]
    epoch = first[-1]["epoch"] if stopped % 3 else first[-1]["epoch"] + 1  # the epoch the preemption was in
    rows = collections.Counter(r for s in first + second if s["epoch"] == epoch for r in s["rows"])
    whole = collections.Counter(r for s in second if s["epoch"] == epoch + 1 for r in s["rows"])  # a whole epoch
    assert sum(rows.values()) == sum(whole.values()) == 96 and rows == whole  # every example of that epoch once
    assert second[-1]["step"] == STEPS


def test_a_grid_as_a_job_array_resumes_a_preempted_cell_and_gives_the_local_table(cluster, tmp_path, tiny_model_dir,
                                                                                  fixtures_dir):
    config = train_config(tmp_path / "config", tiny_model_dir, fixtures_dir)
    data = yaml.safe_load(Path(config).read_text())
    data["trainer"]["callbacks"] = [c for c in data["trainer"]["callbacks"] if "RecordExamples" not in c["class_path"]]
    data["trainer"]["max_steps"] = 12
    Path(config).write_text(yaml.safe_dump(data))
    grid_args = ["--name", "g", "--config", config, "--vary", "model.init_args.lr=1e-3,2e-3", "--seeds", "3",
                 "--set", "last_checkpoint.every_n_train_steps=1", "--eval_precision", "32",
                 "--sts_dir", str(fixtures_dir / "sts"), "--threads", "1"]
    command = [sys.executable, "experiments/grid.py", *grid_args]
    sub = subprocess.run([*command, "--launcher", "slurm", "--out", str(tmp_path / "slurm"),
                          "--records", str(tmp_path / "slurm-records")], cwd=ROOT, env=job_env(), capture_output=True,
                         text=True)
    assert sub.returncode == 0, sub.stderr
    array = re.search(r"submitted job array (\d+)", sub.stdout).group(1)
    table_job = re.search(r"table job (\d+)", sub.stdout).group(1)
    first_cell = tmp_path / "slurm" / "g" / "lr=1e-3" / "seed3"
    wait_for(lambda: glob.glob(str(first_cell / "train" / "**" / "last.ckpt"), recursive=True), 180,
             "the first cell's first checkpoint")
    subprocess.run(["scancel", "--signal=USR1", f"{array}_0"], check=True)
    wait_state(table_job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=480)
    task_log = (tmp_path / "slurm" / "g" / "slurm" / f"{array}_0.out").read_text()
    # the cell's run saved and requeued its array task (which ends the step at once); the requeued task resumed it
    assert f"requeued SLURM job {array}_0" in (first_cell / "train.log").read_text()
    assert task_log.count("train lr=1e-3/seed3") == 2 and "done  lr=1e-3/seed3" in task_log
    local = subprocess.run([*command, "--out", str(tmp_path / "local"), "--records", str(tmp_path / "local-records")],
                           cwd=ROOT, env=job_env(), capture_output=True, text=True)
    assert local.returncode == 0, local.stderr[-3000:]
    on_slurm = (tmp_path / "slurm" / "g" / "table.md").read_text()
    assert on_slurm == (tmp_path / "local" / "g" / "table.md").read_text()
    assert "| lr=1e-3 | 1/1 |" in on_slurm and "| lr=2e-3 | 1/1 |" in on_slurm
    for cell in ("lr=1e-3", "lr=2e-3"):
        a = json.loads((tmp_path / "slurm-records" / "g" / cell / "seed3.json").read_text())
        b = json.loads((tmp_path / "local-records" / "g" / cell / "seed3.json").read_text())
        assert a["test"] == b["test"] and a["dev_curve"] == b["dev_curve"]
    assert json.loads((tmp_path / "slurm-records" / "g" / "lr=1e-3" / "seed3.json").read_text())["attempts"] == 2
