"""The run's own checkpoints beside ModelCheckpoint's: where they live, ``last.ckpt`` written now, at the end
of a run that stops between validations, and every N steps or minutes (with a free-space check at set-up)."""
from __future__ import annotations

import glob
import os
import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from .checkpoint import check_free_space


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


class AfterOptimizerSteps(Callback):
    """Acts in ``on_train_batch_end`` only right after an optimizer step: a checkpoint taken between
    accumulated micro-batches would drop their gradients while counting their batches as done."""

    _seen_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._seen_step = trainer.global_step

    def _stepped(self, trainer: L.Trainer) -> bool:
        stepped, self._seen_step = trainer.global_step != self._seen_step, trainer.global_step
        return stepped


class PeriodicCheckpoint(AfterOptimizerSteps):
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
