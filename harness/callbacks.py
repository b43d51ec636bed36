"""Callbacks the CLI adds to every run: the final and periodic ``last.ckpt`` (with a free-space check
at set-up), preemption, a stop at the first non-finite loss, and the random state and epoch position
that make a resumed run continue exactly."""
from __future__ import annotations

import glob
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .checkpoint import check_free_space

log = logging.getLogger(__name__)


def checkpoint_dirs(trainer: L.Trainer, this_run: bool = False) -> list[str]:
    """Where checkpoints are kept: ModelCheckpoint's ``dirpath`` once Lightning has set it (or when
    configured); before that, for a resume, every version directory's ``checkpoints`` under the
    logger's root (each run of a ``default_root_dir`` has its own); else, or for ``this_run``,
    ``<default_root_dir>/checkpoints``."""
    callback = trainer.checkpoint_callback
    if isinstance(callback, ModelCheckpoint) and callback.dirpath:
        return [str(callback.dirpath)]
    logger = trainer.logger
    if not this_run and logger is not None and getattr(logger, "root_dir", None):
        return sorted(glob.glob(os.path.join(str(logger.root_dir), "*", "checkpoints")))
    return [os.path.join(str(trainer.default_root_dir), "checkpoints")]


def checkpoint_dir(trainer: L.Trainer) -> str:
    """This run's checkpoint directory."""
    return checkpoint_dirs(trainer, this_run=True)[0]


def save_last(trainer: L.Trainer) -> str:
    """Write ``last.ckpt`` now (every rank must call this, like ``trainer.save_checkpoint``)."""
    callback = trainer.checkpoint_callback
    if not isinstance(callback, ModelCheckpoint):
        path = os.path.join(checkpoint_dir(trainer), "last.ckpt")
        trainer.save_checkpoint(path, weights_only=False)
        return path
    path = os.path.join(checkpoint_dir(trainer), f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}")
    # Set before saving, so the checkpoint's ModelCheckpoint state names it: a run resumed in the
    # same directory (a requeued SLURM job) then keeps refreshing last.ckpt, not last-v1.ckpt.
    previous, callback.last_model_path = callback.last_model_path, path
    try:
        trainer.save_checkpoint(path, weights_only=False)
    except BaseException:
        callback.last_model_path = previous
        raise
    return path


class SaveFinalState(Callback):
    """Write ``last.ckpt`` when training ends between two validations, or before its first one.

    ModelCheckpoint saves after each validation; a run that stops at ``max_steps`` between two of them would
    otherwise lose its final steps (with ``checkpoint.save_last``). A run that ends before its first
    validation has no best checkpoint and, without this, no checkpoint at all: it gets ``last.ckpt`` whatever
    ``save_last`` says, and says so in one line (``ended_before_validation`` is then its path).
    """

    def __init__(self) -> None:
        self.ended_before_validation: str | None = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        checkpoint = trainer.checkpoint_callback
        if not isinstance(checkpoint, ModelCheckpoint) or checkpoint.dirpath is None:
            return
        never_validated = not checkpoint.best_model_path and not checkpoint.last_model_path
        # No public hook says at which step ModelCheckpoint last saved; this attribute is where it keeps it.
        if checkpoint._last_global_step_saved == trainer.global_step and not never_validated:
            return
        if checkpoint.save_last or never_validated:
            path = save_last(trainer)
            if never_validated:
                self.ended_before_validation = path
                if trainer.is_global_zero:
                    print(f"the run ended at step {trainer.global_step}, before its first validation (none of its "
                          f"{checkpoint.monitor} figures exist, so no best checkpoint); saved {path}",
                          file=sys.stderr, flush=True)


class _AfterOptimizerSteps(Callback):
    """Acts in ``on_train_batch_end`` only right after an optimizer step: a checkpoint taken between
    accumulated micro-batches would drop their gradients while counting their batches as done."""

    _seen_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._seen_step = trainer.global_step

    def _stepped(self, trainer: L.Trainer) -> bool:
        stepped, self._seen_step = trainer.global_step != self._seen_step, trainer.global_step
        return stepped


class PeriodicCheckpoint(_AfterOptimizerSteps):
    """Refresh ``last.ckpt`` every ``every_n_train_steps`` steps and/or ``every_n_minutes`` minutes
    of training, so a run killed without warning (SIGKILL, a lost node) loses at most that much.

    The checkpoint is taken after an optimizer step and holds the data position, so the resumed
    run continues mid-epoch with the next batch.

    Args:
        every_n_train_steps: save every this many optimizer steps (None: no step trigger).
        every_n_minutes: save when this many minutes passed since the last save (None: no time trigger).
    """

    def __init__(self, every_n_train_steps: int | None = None, every_n_minutes: float | None = 30.0) -> None:
        if every_n_train_steps is not None and every_n_train_steps < 1:
            raise ValueError(f"last_checkpoint.every_n_train_steps must be positive, got {every_n_train_steps}")
        if every_n_minutes is not None and every_n_minutes <= 0:
            raise ValueError(f"last_checkpoint.every_n_minutes must be positive, got {every_n_minutes}")
        self.every_n_train_steps = every_n_train_steps
        self.every_n_minutes = every_n_minutes
        self._last_save = time.monotonic()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Before the first validation and training: a disk that cannot hold one checkpoint would
        # otherwise be found at the first save. Rank 0 writes the checkpoints, so it decides.
        callback = trainer.checkpoint_callback
        directory = str(callback.dirpath) if isinstance(callback, ModelCheckpoint) and callback.dirpath \
            else str(trainer.default_root_dir)
        problem = None
        if trainer.is_global_zero:
            try:
                check_free_space(directory, pl_module)
            except ValueError as err:
                problem = err
        problem = trainer.strategy.broadcast(problem)
        if problem is not None:
            raise problem

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._last_save = time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._stepped(trainer):
            return
        due = self.every_n_train_steps is not None and trainer.global_step % self.every_n_train_steps == 0
        if self.every_n_minutes is not None:
            # the ranks' clocks differ and saving is collective: any rank's clock decides for all
            late = time.monotonic() - self._last_save >= 60 * self.every_n_minutes
            due = trainer.strategy.reduce_boolean_decision(late, all=False) or due
        if due:
            save_last(trainer)
            self._last_save = time.monotonic()


class Preempted(SystemExit):
    """Training stopped on a preemption signal after saving its state: exit code 0."""


class Preemption(_AfterOptimizerSteps):
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


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message says where and where the last finite state is."""


class StopOnNonFiniteLoss(Callback):
    """Stop at the first NaN or infinite loss, before its gradient reaches the weights.

    The check runs before backward, so the weights and optimizer state are still the last finite
    ones: they are saved as ``nonfinite-step<N>.ckpt`` next to the run's other checkpoints, and
    training ends with :class:`NonFiniteLossError` naming the step, the logged parts of the loss
    and the learning rate. Under DDP every rank stops at the same step.
    """

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        finite = bool(torch.isfinite(loss.detach()).all())
        if trainer.strategy.reduce_boolean_decision(finite, all=True):  # every rank stops if one must
            return
        path = os.path.join(checkpoint_dir(trainer), f"nonfinite-step{trainer.global_step}.ckpt")
        trainer.save_checkpoint(path, weights_only=False)
        parts = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("train/") and k != "train/lr"}
        shown = ", ".join(f"{k.removeprefix('train/')}={float(v):.6g}" for k, v in sorted(parts.items()))
        lrs = ", ".join(f"{lr:.3g}" for lr in sorted({g["lr"] for o in trainer.optimizers for g in o.param_groups}))
        if finite:
            what = "non-finite loss on another rank"
        else:
            value = float(loss.detach().float().reshape(-1)[0]) if loss.numel() == 1 else "nan/inf"
            what = f"non-finite loss {value}" + (f" on rank {trainer.global_rank}" if trainer.world_size > 1 else "")
        raise NonFiniteLossError(
            f"{what} at step {trainer.global_step} (epoch {trainer.current_epoch}); logged: {shown or 'nothing'}; "
            f"lr={lrs}. The last finite state is saved in {path}"
        )


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
        "python": random.getstate(),
        # plain lists: checkpoints load with weights_only=True, which refuses numpy arrays
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


class RandomState(Callback):
    """Store every rank's random generators (torch, CUDA, Python, NumPy) in each checkpoint and
    restore them when training resumes, so dropout masks and DCLR's noise continue as in an
    uninterrupted run (with a fixed seed, a resumed run ends with the same weights)."""

    def __init__(self) -> None:
        self._pending: list[dict[str, Any]] | None = None

    def state_dict(self) -> dict[str, Any]:
        state = _rng_state()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            states: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(states, state)  # every rank saves (and so calls this) at the same step
            return {"ranks": states}
        return {"ranks": [state]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict.get("ranks") or None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        # Applied at the first resumed step, where the saved run took its next random number.
        if self._pending:
            ranks = self._pending
            self._pending = None
            _set_rng_state(ranks[trainer.global_rank] if len(ranks) == trainer.world_size else ranks[0])


class ResumedEpochPosition(Callback):
    """Keep the data's place in training exact across a resume: the epoch whose order the batch sampler draws,
    and the batch count of an epoch the data module re-expressed.

    The epoch: Lightning hands each sampler its count of *processed* epochs at every epoch start, and a run
    resumed from a checkpoint written at an epoch's end (after the last batch, around its validation) counts
    that epoch as processed but not completed; the next epoch would then draw the order of the one after it.
    ``trainer.current_epoch`` (the completed epochs) is the epoch that trains, so it is set again at every epoch
    start. A resume inside an epoch starts no epoch: the sampler keeps the saved epoch and position.

    The count: the batch sampler continues an epoch saved on another number of devices (or with another batch
    size) in this run's batches (``SentenceBatchSampler.load_state_dict``); the epoch's batch count Lightning
    restored is still in the saved run's batches. Left so, the epoch would end early (a count past this run's
    batches per epoch) or repeat its start. The counts are set to the sampler's before the epoch loop starts;
    a resume on unchanged settings is left alone.
    """

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sampler = getattr(trainer.datamodule, "train_sampler", None)
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(trainer.current_epoch)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sampler = getattr(trainer.datamodule, "train_sampler", None)
        target = getattr(sampler, "resumed_batches_done", None)
        if target is None:
            return
        sampler.resumed_batches_done = None
        # The loop's count of this epoch's batches (ready/started/processed/completed); the epoch
        # loop resets the others to ``completed`` (+1 when saved after a batch) as it restarts.
        current = trainer.fit_loop.epoch_loop.batch_progress.current
        shift = target - current.processed
        current.ready += shift
        current.started += shift
        current.processed += shift
        current.completed += shift
