"""Preemption: SIGUSR1 (ahead of a SLURM time limit) or SIGTERM (scancel, a preempting job) ends training at a
step boundary with a saved ``last.ckpt`` and exit code 0; SIGUSR1 also requeues the SLURM job."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .checkpointing import AfterOptimizerSteps, save_last

log = logging.getLogger(__name__)


class Preempted(SystemExit):
    """Training stopped on a preemption signal after saving its state: exit code 0."""


class Preemption(AfterOptimizerSteps):
    """On SIGUSR1 or SIGTERM: finish the current step, write ``last.ckpt`` and exit with code 0;
    ``--ckpt_path last`` then resumes exactly where it stopped. On SIGUSR1 under SLURM the job is also
    requeued (``scontrol requeue``).

    SLURM sends SIGUSR1 ahead of the time limit with ``#SBATCH --signal=SIGUSR1@90`` (or on
    ``scancel --signal=USR1``): the job asks to come back, so it is requeued, unless the cluster
    environment says ``auto_requeue: false``. SIGTERM comes from ``scancel`` (the user ends the job: it
    is not requeued) or from a preemption (``PreemptMode=REQUEUE`` requeues the job itself). The handler
    only raises a flag: the checkpoint is written at the next step boundary, never halfway through an
    optimizer step, and all ranks agree on the step (with gradient accumulation SIGUSR1 waits for the
    optimizer step; SIGTERM does not, since Lightning stops after the batch). This replaces Lightning's
    own SIGUSR1 handler, which saves from inside the signal handler, mid-step.
    """

    def __init__(self) -> None:
        self._signalled: str | None = None
        self._previous: Any = None
        self._saved_step = -1

    def _flag(self, signum: int, frame: Any) -> None:
        self._signalled = signal.Signals(signum).name

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Before Lightning installs its handlers (it keeps a SIGUSR1 handler that is already there).
        if stage == "fit" and threading.current_thread() is threading.main_thread():
            self._signalled = None
            self._previous = signal.signal(signal.SIGUSR1, self._flag)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._previous)
            self._previous = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        stepped = self._stepped(trainer)
        flags = torch.tensor([self._signalled is not None, trainer.received_sigterm], dtype=torch.float32,
                             device=pl_module.device)
        usr1, term = (trainer.strategy.reduce(flags, reduce_op="sum") > 0).tolist()  # any rank: every rank
        # SIGUSR1 waits for the optimizer step; on SIGTERM Lightning stops after this batch anyway,
        # so with gradient accumulation the unfinished accumulation is not trained on.
        if term or (usr1 and stepped):
            self._stop(trainer, "SIGTERM" if term else "SIGUSR1")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # Lightning stops on SIGTERM by itself during validation; save there too when it is safe
        # (one process: under DDP the ranks may not be at the same point).
        if isinstance(exception, SIGTERMException) and trainer.world_size == 1 \
                and self._saved_step != trainer.global_step:
            path = save_last(trainer)
            self._report(trainer, "SIGTERM", path, None)

    def _stop(self, trainer: L.Trainer, name: str) -> None:
        path = save_last(trainer)
        self._saved_step = trainer.global_step
        self._report(trainer, name, path, self._requeue(trainer) if name == "SIGUSR1" else None)
        raise Preempted(0)

    @staticmethod
    def _report(trainer: L.Trainer, name: str, path: str, requeued: str | None) -> None:
        if trainer.is_global_zero:
            then = f"requeued SLURM job {requeued}" if requeued else "resume with --ckpt_path last"
            print(f"preempted ({name}) after step {trainer.global_step}: saved {path}; {then}", file=sys.stderr,
                  flush=True)

    @staticmethod
    def _requeue(trainer: L.Trainer) -> str | None:
        """``scontrol requeue`` the job from rank 0 when running under SLURM with auto-requeue."""
        # Single-device strategies do not expose the cluster environment and no public hook does;
        # Lightning keeps it on the trainer's accelerator connector.
        environment = getattr(trainer.strategy, "cluster_environment", None) or getattr(
            getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
        if not isinstance(environment, SLURMEnvironment) or not environment.auto_requeue or not trainer.is_global_zero:
            return None
        job = os.environ.get("SLURM_JOB_ID", "")
        if os.environ.get("SLURM_ARRAY_JOB_ID"):
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
        if not job:
            return None
        try:
            result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            log.warning("could not requeue SLURM job %s: %s", job, err)
            return None
        if result.returncode != 0:
            log.warning("scontrol requeue %s failed: %s", job, result.stderr.strip())
            return None
        return job
