"""A training run under ``srun``: its Trainer layout checked against the SLURM step, and its rendezvous port.

Run in ``train.py``'s first second, before torch is imported (``harness.launch``), so a job whose Trainer asks
for another layout than the allocation gives ends with one line, not a rendezvous that waits for ranks that
never come (or a traceback from every rank).

**The rendezvous port.** ``MASTER_PORT`` when the job sets it; otherwise ``SENTEMB_PORT_BASE + job id %
SENTEMB_PORT_SPAN`` (default 20000 + job id % 10000: ports 20000-29999, below Linux's ephemeral range, which
starts at 32768). Lightning's own default, 15000 + the job id's last four digits, is shared by every job whose
id ends alike on any cluster of the machine; this one differs between two concurrent jobs unless their ids
differ by a multiple of the span. A requeued job keeps its id, hence its port.
"""
from __future__ import annotations

import os
import re
import socket
from typing import Any, Mapping

PORT_BASE, PORT_SPAN = 20000, 10000


def under_srun(env: Mapping[str, str]) -> bool:
    """A task of a SLURM job step (``srun``), which is what Lightning's SLURM environment needs."""
    return "SLURM_STEP_ID" in env and "SLURM_PROCID" in env and env.get("SLURM_JOB_NAME") not in ("bash",
                                                                                                  "interactive")


def master_port(env: Mapping[str, str]) -> int:
    """The rendezvous port of this job (the module's docstring says how it is chosen)."""
    if env.get("MASTER_PORT"):
        return int(env["MASTER_PORT"])
    base = int(env.get("SENTEMB_PORT_BASE", PORT_BASE))
    span = int(env.get("SENTEMB_PORT_SPAN", PORT_SPAN))
    return base + int(env.get("SLURM_JOB_ID", "0")) % span


def first_node(nodelist: str) -> str:
    """The first host of a SLURM node list (``node[3-5,7],gpu1`` gives ``node3``), as Lightning takes it."""
    head = re.match(r"([^,\[]+)(?:\[([^\]]*)\])?", nodelist.strip())
    if head is None:
        return nodelist
    name, ranges = head.group(1), head.group(2)
    return name + re.split(r"[,-]", ranges)[0] if ranges else name


def _tasks_per_node(value: str) -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1]: SLURM's compressed count of tasks on each node."""
    counts = []
    for part in value.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found:
            counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def layout_error(config: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """The error line (without ``error:``) of a run whose Trainer layout (``trainer.devices`` per node x
    ``trainer.num_nodes``) is not the srun step's (tasks per node x nodes), whose GPU nodes have fewer GPUs
    than tasks, or whose rendezvous host does not resolve; None when it can run."""
    if not under_srun(env):
        return None
    trainer = config.get("trainer") or {}
    per_node = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")))
    nodes = _int(env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES"))) or len(per_node) or 1
    devices, num_nodes = trainer.get("devices", "auto"), _int(trainer.get("num_nodes", 1)) or 1
    if per_node and len(set(per_node)) > 1:
        return (f"the SLURM step has an uneven number of tasks per node ({env.get('SLURM_STEP_TASKS_PER_NODE')}); "
                "DDP needs the same number on every node: give --ntasks-per-node")
    tasks = per_node[0] if per_node else 1
    if isinstance(devices, int) and (devices, num_nodes) != (tasks, nodes) or num_nodes != nodes:
        shown = devices if isinstance(devices, int) else repr(devices)
        return (f"the Trainer asks for {shown} device(s) per node on {num_nodes} node(s) (trainer.devices, "
                f"trainer.num_nodes), but this SLURM step runs {tasks} task(s) per node on {nodes} node(s); one task "
                f"per device: give --trainer.devices {tasks} --trainer.num_nodes {nodes}, or ask sbatch for "
                f"--nodes={num_nodes} --ntasks-per-node={shown}")
    gpus = _int(env.get("SLURM_GPUS_ON_NODE"))
    if trainer.get("accelerator") in ("gpu", "cuda") and gpus is not None and gpus < tasks:
        return (f"this node has {gpus} GPU(s) for {tasks} task(s) (one task per device): ask sbatch for "
                f"--gpus-per-node={tasks}, or for --ntasks-per-node={gpus}")
    if nodes > 1 and not env.get("MASTER_ADDR"):
        host = first_node(env.get("SLURM_NODELIST", env.get("SLURM_JOB_NODELIST", "")))
        try:
            socket.getaddrinfo(host, None)
        except OSError:
            return (f"the rendezvous host {host} (the first node of SLURM_NODELIST) does not resolve on "
                    f"{env.get('SLURMD_NODENAME', socket.gethostname())}; set MASTER_ADDR to an address of it that "
                    "every node can reach, or make the node names resolve (docs/CLUSTER.md)")
    return None


def set_master_port(env: dict) -> None:
    """Under srun, export this job's rendezvous port for Lightning's SLURM environment (which reads
    ``MASTER_PORT`` before its own default)."""
    if under_srun(env) and not env.get("MASTER_PORT"):
        env["MASTER_PORT"] = str(master_port(env))
