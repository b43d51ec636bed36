"""SLURM on a real scheduler: the shipped sbatch script as a 2-rank DDP job on CPU, preemption by SIGUSR1 with a
requeue and an exact resume, scancel, a job requeued with another task count, and a grid as a job array; then the
same on two nodes: a two-node job against one process, negatives gathered across nodes, a preempted two-node job,
a resume on another node count, the layout checks, and a grid whose cells span two nodes.

The cluster is the two-node one of ``slurm/local_cluster.sh`` (``.ci/run`` brings it up; this module brings it
up itself when it can and takes down only what it started). Where no scheduler can run (not root, no
packages), the module is skipped with one line. Every job and subprocess has a time limit, so nothing hangs."""
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
from tests.test_reliability import run_config, train_script

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

STEPS = 24  # 96 fixture pairs, 16 per rank and step: 3 steps an epoch on 2 ranks


def _cluster_conf() -> tuple[str | None, bool, str]:
    """(SLURM_CONF of a working cluster, whether this module started it, why not)."""
    conf = os.environ.get("SLURM_CONF")
    if conf and shutil.which("sinfo") and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0:
        return conf, False, ""
    if os.geteuid() != 0:
        return None, False, "not root, and no running cluster in SLURM_CONF"
    up = subprocess.run(["bash", str(ROOT / "slurm" / "local_cluster.sh"), "up", "--nodes", "2"], capture_output=True,
                        text=True, timeout=600)
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
    # one thread per rank whatever the layout (Lightning gives a rank cores / ranks of its node otherwise), so that
    # a job on 1 node x 2 tasks and one on 2 nodes x 1 task sum in the same order
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    env.pop("SENTEMB_TEST_FAULT", None)
    return env


def submit(*args: str) -> str:
    result = subprocess.run(["sbatch", "--parsable", *args], cwd=ROOT, env=job_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job(job_id: str) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=60).stdout
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


def sbatch_train(root: Path, config: str, *sbatch: str, args: tuple[str, ...] = ()) -> str:
    return submit(*sbatch, f"--output={root}/slurm-%j.out", "slurm/train.sbatch", "--config", config,
                  "--validate_first", "false", "--trainer.default_root_dir", str(root / "runs"), *args)


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


def assert_same_weights(found: tuple[int, dict], expected: tuple[int, dict], steps: int = STEPS) -> None:
    assert found[0] == expected[0] == steps
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


# -- two nodes -------------------------------------------------------------------------------------------------
TWO_NODES = ("--nodes=2", "--ntasks-per-node=1")
NODE_STEPS = 8  # 96 fixture pairs, 16 per rank and step: 3 steps an epoch on 2 ranks, a preemption mid-epoch


def test_the_layout_check_and_the_rendezvous_port_read_the_slurm_variables():
    from harness.slurm_layout import first_node, layout_error, master_port

    assert [first_node(n) for n in ("node[3-5,7],gpu1", "a1,b2", "gpu[12]", "sentemb[1-2]")] == \
        ["node3", "a1", "gpu12", "sentemb1"]
    # the documented rule: MASTER_PORT, else SENTEMB_PORT_BASE (20000) + job id % SENTEMB_PORT_SPAN (10000)
    assert master_port({"SLURM_JOB_ID": "123456"}) == 20000 + 3456
    assert master_port({"SLURM_JOB_ID": "123456", "SENTEMB_PORT_BASE": "40000", "SENTEMB_PORT_SPAN": "100"}) == 40056
    assert master_port({"SLURM_JOB_ID": "123456", "MASTER_PORT": "29500"}) == 29500
    step = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_JOB_NAME": "j", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            "SLURM_STEP_NUM_NODES": "2", "SLURM_NODELIST": "sentemb[1-2]", "MASTER_ADDR": "127.0.0.1"}
    fits = {"trainer": {"devices": 2, "num_nodes": 2, "accelerator": "cpu"}}
    assert layout_error(fits, step) is None
    assert "asks for 4 device(s) per node on 2 node(s) (trainer.devices, trainer.num_nodes), but this SLURM step " \
        "runs 2 task(s) per node on 2 node(s)" in layout_error({"trainer": {"devices": 4, "num_nodes": 2}}, step)
    assert layout_error({"trainer": {"devices": 4, "num_nodes": 2}}, {k: v for k, v in step.items()
                                                                      if k != "SLURM_STEP_ID"}) is None  # not srun
    assert "asks for 2 device(s) per node on 1 node(s)" in layout_error({"trainer": {"devices": 2}}, step)
    assert "uneven" in layout_error(fits, {**step, "SLURM_STEP_TASKS_PER_NODE": "2,1"})
    gpus = {"trainer": {**fits["trainer"], "accelerator": "gpu"}}
    assert "1 GPU(s) for 2 task(s)" in layout_error(gpus, {**step, "SLURM_GPUS_ON_NODE": "1"})
    assert layout_error(gpus, {**step, "SLURM_GPUS_ON_NODE": "2"}) is None
    unresolved = {k: v for k, v in step.items() if k != "MASTER_ADDR"} | {"SLURM_NODELIST": "nosuchnode1.invalid"}
    assert "the rendezvous host nosuchnode1.invalid (the first node of SLURM_NODELIST) does not resolve" in \
        layout_error(fits, unresolved)


@pytest.fixture(scope="module")
def two_nodes(cluster) -> str:
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=60).stdout.split()
    assert len(set(nodes)) >= 2, f"the cluster in SLURM_CONF has {len(set(nodes))} node(s): run local_cluster.sh up " \
                                 "--nodes 2"
    return cluster


@pytest.fixture(scope="module")
def still_model_dir(tmp_path_factory) -> str:
    """The tiny BERT without dropout: one process and two then draw no different masks for the same examples."""
    from transformers import BertConfig

    from tests.conftest import _tiny_model

    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return _tiny_model(tmp_path_factory.mktemp("tiny-still"), config)


def node_config(root: Path, model: str, fixtures: Path, per_device: int = 16) -> str:
    """train_config for NODE_STEPS steps, with a longer sleep after each step (time for a signal to land) and a
    short collective timeout."""
    config = train_config(root, model, fixtures)
    data = yaml.safe_load(Path(config).read_text())
    data["trainer"]["max_steps"] = NODE_STEPS
    data["data"]["init_args"]["per_device_batch_size"] = per_device
    data["ddp_timeout_minutes"] = 2  # a rank stuck in a collective fails the job within minutes, not 15
    for callback in data["trainer"]["callbacks"]:
        if callback["class_path"].endswith("SlowSteps"):
            callback["init_args"]["seconds"] = 1.0
    Path(config).write_text(yaml.safe_dump(data))
    return config


def one_process(config: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The same config as one plain process with one thread, as the jobs' ranks compute (job_env)."""
    return train_script(config, "--trainer.default_root_dir", str(Path(config).parent / "runs"),
                        env={"OMP_NUM_THREADS": "1"}, timeout=timeout)


def max_difference(found: dict, expected: dict) -> float:
    assert found.keys() == expected.keys()
    return max((found[k] - v).abs().max().item() for k, v in expected.items())


def report(name: str, value: float) -> None:
    print(f"\n{name}: max abs weight difference {value:.3g}")


@pytest.fixture(scope="module")
def two_node_job(two_nodes, tmp_path_factory, still_model_dir, fixtures_dir) -> dict:
    """An uninterrupted job on 2 nodes x 1 task."""
    root = tmp_path_factory.mktemp("slurm-two-nodes")
    job_id = sbatch_train(root, node_config(root, still_model_dir, fixtures_dir), *TWO_NODES)
    info = wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=420)
    log = log_of(root, job_id)
    assert info["JobState"] == "COMPLETED", log[-3000:]
    return {"root": root, "job": job_id, "log": log, "final": final_weights(root)}


# Two ranks' gradients are averaged by one all_reduce where one process sums one batch: the same sums in another
# order, so fp32 weights agree to rounding (a few ulp of values near 1 per step), not bit for bit.
ROUNDING = 1e-5


def test_a_two_node_job_trains_the_weights_of_one_process_on_the_same_global_batches(two_node_job, tmp_path,
                                                                                    still_model_dir, fixtures_dir):
    log = two_node_job["log"]
    assert f"job {two_node_job['job']} (restart 0): 2 node(s) x 1 task(s) on cpu (sentemb[1-2])" in log
    assert "Starting with 2 processes" in log
    seen = steps_seen(two_node_job["root"])
    assert {(s["rank"], s["node"], s["world"]) for s in seen} == {(0, "sentemb1", 2), (1, "sentemb2", 2)}
    result = one_process(node_config(tmp_path, still_model_dir, fixtures_dir, per_device=32))
    assert result.returncode == 0, result.stderr[-3000:]
    mine = steps_seen(tmp_path)
    # the same global batches: rank 0's and rank 1's examples of each step are the one process's
    for step in range(1, NODE_STEPS + 1):
        ranks = sorted((s for s in seen if s["step"] == step), key=lambda s: s["rank"])
        assert [r for s in ranks for r in s["rows"]] == [s for s in mine if s["step"] == step][0]["rows"]
    step, weights = final_weights(tmp_path)
    assert step == two_node_job["final"][0] == NODE_STEPS
    difference = max_difference(two_node_job["final"][1], weights)
    report("two nodes vs one process", difference)
    assert difference <= ROUNDING


def test_in_batch_negatives_gathered_across_two_nodes_equal_one_process_with_the_whole_batch(two_nodes, tmp_path,
                                                                                             still_model_dir,
                                                                                             fixtures_dir):
    from tests.test_train import objective_config

    def mnr(root: Path, per_device: int) -> str:
        root.mkdir(parents=True)
        path = Path(objective_config(root, still_model_dir, fixtures_dir, "MNR", "NLIDataModule",
                                     data_args={"view": "pairs", "per_device_batch_size": per_device},
                                     model_args={"gather_across_devices": True}))
        config = yaml.safe_load(path.read_text())
        config["trainer"].update({"max_steps": 3, "val_check_interval": 100, "precision": "32"})
        path.write_text(yaml.safe_dump(config))
        return str(path)

    job_id = sbatch_train(tmp_path / "nodes", mnr(tmp_path / "nodes", 8), *TWO_NODES)
    result = one_process(mnr(tmp_path / "one", 16))  # while the job runs
    assert result.returncode == 0, result.stderr[-3000:]
    info = wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=420)
    assert info["JobState"] == "COMPLETED", log_of(tmp_path / "nodes", job_id)[-3000:]
    assert "2 node(s) x 1 task(s)" in log_of(tmp_path / "nodes", job_id)
    found, expected = final_weights(tmp_path / "nodes"), final_weights(tmp_path / "one")
    assert found[0] == expected[0] == 3
    difference = max_difference(found[1], expected[1])
    report("MNR, 8 per node gathered vs 16 on one process", difference)
    assert difference <= ROUNDING


def preempt_and_wait_pending(root: Path, job_id: str, steps: int, hold: bool = False) -> int:
    """USR1 once the ranks have ``steps`` step records; the job saves and is requeued (and held, with ``hold``).
    The step it stopped after."""
    wait_for(lambda: len(steps_seen(root)) >= steps, 300, f"{steps} step records")
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True, timeout=60)
    wait_state(job_id, ("PENDING",), timeout=180)  # requeued: it may not start before its credential expires
    if hold:
        subprocess.run(["scontrol", "hold", job_id], check=True, timeout=60)
    # srun passes rank 0's line on as the requeue ends the step: it may reach the log after the job is pending
    found = wait_for(lambda: re.search(r"preempted \(SIGUSR1\) after step (\d+): saved \S+; requeued",
                                       log_of(root, job_id)), 60, "the preemption's line")
    return int(found.group(1))


def test_sigusr1_on_two_nodes_every_rank_saves_and_the_requeued_job_ends_with_the_uninterrupted_weights(
        two_node_job, tmp_path, still_model_dir, fixtures_dir):
    job_id = sbatch_train(tmp_path, node_config(tmp_path, still_model_dir, fixtures_dir), *TWO_NODES)
    stopped = preempt_and_wait_pending(tmp_path, job_id, 4)
    info = wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=420)
    log = log_of(tmp_path, job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log[-3000:]
    # every rank stopped after the same step and exited 0 (srun names a task that did not)
    # the resumed run starts after the saved step: the records of that step are the first run's, one per rank
    last = [(s["rank"], s["node"]) for s in steps_seen(tmp_path) if s["step"] == stopped]
    assert sorted(last) == [(0, "sentemb1"), (1, "sentemb2")]
    # rank 0 requeued the job once the save was done (its barrier passed by every rank; its line is printed after
    # both, and srun may relay it after SLURM's own lines, so the order within the log proves nothing); the requeue
    # then ends the step on both nodes, and no rank failed before it
    assert re.search(rf"preempted \(SIGUSR1\) after step {stopped}: saved \S+; requeued SLURM job {job_id}\b", log)
    assert f"STEP {job_id}.0 ON sentemb1 CANCELLED" in log
    assert "DUE TO JOB REQUEUE" in log and "exited with exit code" not in log
    assert f"job {job_id} (restart 1): 2 node(s) x 1 task(s) on cpu" in log
    assert re.search(rf"--ckpt_path last: resuming from \S+ \(step {stopped}\)", log)
    found = final_weights(tmp_path)
    report("two nodes preempted vs uninterrupted", max_difference(found[1], two_node_job["final"][1]))
    assert_same_weights(found, two_node_job["final"], NODE_STEPS)


def test_a_two_node_job_resumes_on_one_node_and_a_one_node_job_on_two(two_node_job, tmp_path, still_model_dir,
                                                                      fixtures_dir):
    # two nodes -> one node of one task: another device count, so docs/RELIABILITY.md's rule: the interrupted
    # epoch goes on with the examples it has not trained on. one node of two tasks -> two nodes of one: the same
    # devices in total, and the node count is not part of a run's state: the uninterrupted weights, bit for bit.
    shrink, grow = tmp_path / "shrink", tmp_path / "grow"
    jobs = {shrink: sbatch_train(shrink, node_config(shrink, still_model_dir, fixtures_dir), *TWO_NODES),
            grow: sbatch_train(grow, node_config(grow, still_model_dir, fixtures_dir), "--nodes=1",
                               "--ntasks-per-node=2")}
    # in an order SLURM accepts at each call (min nodes <= max nodes <= tasks)
    layouts = {shrink: (("NumNodes=1-1",), ("NumTasks=1", "TasksPerNode=1")),
               grow: (("NumTasks=2", "TasksPerNode=1"), ("NumNodes=2-2",))}
    stopped = {}
    for root, job_id in jobs.items():
        stopped[root] = preempt_and_wait_pending(root, job_id, 4, hold=True)
        for update in layouts[root]:
            subprocess.run(["scontrol", "update", f"JobId={job_id}", *update], check=True, timeout=60)
        subprocess.run(["scontrol", "release", job_id], check=True, timeout=60)
    for root, job_id in jobs.items():
        info = wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=420)
        assert info["JobState"] == "COMPLETED", log_of(root, job_id)[-3000:]

    log = log_of(shrink, jobs[shrink])
    assert f"job {jobs[shrink]} (restart 1): 1 node(s) x 1 task(s) on cpu" in log
    assert "resuming on 1 device(s) with 16 examples per device and step; the checkpoint was saved on 2 with 16" in log
    seen = steps_seen(shrink)
    first = [s for s in seen if s["world"] == 2 and s["step"] <= stopped[shrink]]
    second = [s for s in seen if s["world"] == 1]
    assert {s["node"] for s in first} == {"sentemb1", "sentemb2"} and len({s["node"] for s in second}) == 1
    epoch = first[-1]["epoch"] if stopped[shrink] % 3 else first[-1]["epoch"] + 1  # the epoch the preemption was in
    rows = collections.Counter(r for s in first + second if s["epoch"] == epoch for r in s["rows"])
    whole = collections.Counter(r for s in steps_seen(two_node_job["root"]) if s["epoch"] == 0 for r in s["rows"])
    assert sum(rows.values()) == sum(whole.values()) == 96 and rows == whole  # every example of that epoch once
    assert second[-1]["step"] == NODE_STEPS

    log = log_of(grow, jobs[grow])
    assert f"job {jobs[grow]} (restart 0): 1 node(s) x 2 task(s) on cpu" in log
    assert f"job {jobs[grow]} (restart 1): 2 node(s) x 1 task(s) on cpu" in log
    assert "resuming on" not in log  # the same device count: no re-expressed epoch
    found = final_weights(grow)
    report("one node x 2 -> two nodes x 1 vs uninterrupted", max_difference(found[1], two_node_job["final"][1]))
    assert_same_weights(found, two_node_job["final"], NODE_STEPS)


def test_a_trainer_layout_that_is_not_the_allocation_ends_with_one_line_naming_both(two_nodes, tmp_path,
                                                                                    still_model_dir, fixtures_dir):
    config = node_config(tmp_path, still_model_dir, fixtures_dir)
    job_id = sbatch_train(tmp_path, config, *TWO_NODES, args=("--trainer.devices", "2"))
    info = wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=180)
    log = log_of(tmp_path, job_id)
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", log[-3000:]
    assert errors == ["error: the Trainer asks for 2 device(s) per node on 2 node(s) (trainer.devices, "
                      "trainer.num_nodes), but this SLURM step runs 1 task(s) per node on 2 node(s); one task per "
                      "device: give --trainer.devices 1 --trainer.num_nodes 2, or ask sbatch for --nodes=2 "
                      "--ntasks-per-node=2"], log[-3000:]
    assert "Traceback" not in log and not steps_seen(tmp_path)  # before any work


def test_two_node_ranks_that_cannot_meet_end_after_the_rendezvous_timeout(two_nodes, tmp_path, still_model_dir,
                                                                          fixtures_dir):
    # rank 0 listens on sentemb1's port; rank 1 is sent to a port where nothing listens
    config = node_config(tmp_path, still_model_dir, fixtures_dir)
    result = subprocess.run(
        ["timeout", "300", "srun", "--job-name=rendezvous", "--nodes=2", "--ntasks-per-node=1", "--ntasks=2", "bash", "-c",
         '[ "$SLURM_PROCID" = 1 ] && export MASTER_PORT=9; exec "$@"', "rank", sys.executable, "train.py",
         "--config", config, "--validate_first", "false", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
         "--trainer.num_nodes", "2", "--trainer.strategy", "ddp", "--rendezvous_timeout_minutes", "0.25",
         "--trainer.default_root_dir", str(tmp_path / "runs")],
        cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=320)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and errors, result.stderr[-3000:]
    assert any(re.fullmatch(r"error: rank 1 of 2: no rendezvous with the other ranks at sentemb1:9 within 15 s "
                            r"\(--rendezvous_timeout_minutes\); .*", e) for e in errors), errors
    assert not steps_seen(tmp_path)


def test_a_grid_whose_cells_span_two_nodes_runs_as_a_job_array(two_nodes, tmp_path, still_model_dir, fixtures_dir):
    config = node_config(tmp_path / "config", still_model_dir, fixtures_dir)
    data = yaml.safe_load(Path(config).read_text())
    data["trainer"]["max_steps"] = 3
    data["trainer"]["callbacks"] = [c for c in data["trainer"]["callbacks"] if "SlowSteps" not in c["class_path"]]
    Path(config).write_text(yaml.safe_dump(data))
    grid = subprocess.run(
        [sys.executable, "experiments/grid.py", "--name", "g", "--config", config, "--vary",
         "model.init_args.lr=1e-3,2e-3", "--seeds", "3", "--dev_only", "--sts_dir", str(fixtures_dir / "sts"),
         "--threads", "1", "--launcher", "slurm", "--nodes", "2", "--jobs", "2", "--out", str(tmp_path / "slurm"),
         "--records", str(tmp_path / "records")], cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=120)
    assert grid.returncode == 0, grid.stderr
    array = re.search(r"submitted job array (\d+)", grid.stdout).group(1)
    table_job = re.search(r"table job (\d+)", grid.stdout).group(1)
    wait_state(table_job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=480)
    table = (tmp_path / "slurm" / "g" / "table.md").read_text()
    assert "| lr=1e-3 | 1/1 |" in table and "| lr=2e-3 | 1/1 |" in table, table
    seen = steps_seen(tmp_path / "config")  # both cells' runs append to the config's recorder
    assert len(seen) == 2 * 3 * 2 and {(s["rank"], s["node"], s["world"]) for s in seen} == \
        {(0, "sentemb1", 2), (1, "sentemb2", 2)}
    for task, cell in enumerate(("lr=1e-3", "lr=2e-3")):
        assert job(f"{array}_{task}")["NumNodes"] == "2"
        assert "Starting with 2 processes" in (tmp_path / "slurm" / "g" / cell / "seed3" / "train.log").read_text()
        [last] = glob.glob(str(tmp_path / "slurm" / "g" / cell / "seed3" / "train" / "**" / "last.ckpt"), recursive=True)
        assert torch.load(last, weights_only=True)["global_step"] == 3


# -- the cluster itself (last: it restarts the cluster) -----------------------------------------------------------
def test_up_gives_nodes_that_take_jobs_though_an_earlier_cluster_drained_them(cluster):
    # A node drained once stays drained through a restart unless `up` drops the saved state: a full disk drained
    # both nodes ("SlurmdSpoolDir is full"), and every later run of this module waited on them until its timeouts.
    local = Path(os.environ.get("SENTEMB_SLURM_DIR", "/tmp/sentemb-slurm")) / "slurm.conf"
    assert Path(cluster) == local, f"this test restarts the cluster of slurm/local_cluster.sh ({local}), " \
                                   f"not the one in SLURM_CONF ({cluster})"
    script = ["bash", str(ROOT / "slurm" / "local_cluster.sh")]

    def states() -> dict[str, str]:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=60).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def drain(node: str) -> None:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=drained-by-the-test"],
                       check=True, capture_output=True, timeout=60)
        wait_for(lambda: states()[node].startswith("drain"), 30, f"{node} drained")

    def up() -> subprocess.CompletedProcess:
        done = subprocess.run([*script, "up", "--nodes", "2"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert f"export SLURM_CONF={local}" in done.stdout
        return done

    # drained while up: `up` sees a node that cannot take jobs, says which and why, and starts afresh
    drain("sentemb1")
    again = up()
    assert "only 1 of 2 node(s) can take jobs; starting afresh" in again.stderr, again.stderr
    assert re.search(r"sentemb1 drain\S* drained-by-the-test", again.stderr), again.stderr
    assert states() == {"sentemb1": "idle", "sentemb2": "idle"}
    # drained before `down`: the next `up` does not bring the drain back
    drain("sentemb2")
    subprocess.run([*script, "down"], check=True, capture_output=True, timeout=120)
    up()
    assert states() == {"sentemb1": "idle", "sentemb2": "idle"}
    job_id = submit("--wrap", "hostname", "--nodes=2", "--output=/dev/null")
    assert wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED"), timeout=120)["JobState"] == "COMPLETED"
