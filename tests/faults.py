"""Faults injected into real training runs by tests/test_reliability.py.

Each is a callback (or an objective) named in a run's YAML, so the run under test is a plain
``python train.py --config ...`` subprocess that can be killed like a real job. A fault fires
only where its environment variable says, so the resumed run of the same config is fault-free.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from harness.checkpoint import AtomicCheckpointIO, CheckpointWriteError
from lightning_modules.sts_regression import STSRegression

# "<signal name>@[v]<global step>[:rank]": "SIGKILL@9" as the step after global step 9 starts, "SIGKILL@2:1" on
# rank 1, "SIGKILL@v6" as a validation after global step 6 starts (an epoch-end validation, say)
FAULT_ENV = "SENTEMB_TEST_FAULT"
# "<global step>:<n>": the n-th save of last.ckpt at that global step fails as a full disk would
FAIL_SAVE_ENV = "SENTEMB_TEST_FAIL_SAVE"


class SignalAtStep(Callback):
    """Send ``$SENTEMB_TEST_FAULT``'s signal to this process when a training step (or a validation) is about
    to start."""

    @staticmethod
    def _fire(trainer: L.Trainer, at_validation: bool) -> None:
        fault = os.environ.get(FAULT_ENV)
        if not fault:
            return
        name, _, where = fault.partition("@")
        step, _, rank = where.partition(":")
        if step.startswith("v") != at_validation:
            return
        if trainer.global_step == int(step.lstrip("v")) and trainer.global_rank == int(rank or 0):
            os.kill(os.getpid(), getattr(signal, name))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._fire(trainer, at_validation=False)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._fire(trainer, at_validation=True)


class FailingCheckpointIO(AtomicCheckpointIO):
    """The project's checkpoint writer, except that the save named by ``$SENTEMB_TEST_FAIL_SAVE`` fails with
    the error a full disk gives, before any byte is written (the previous file stays whole)."""

    def __init__(self) -> None:
        super().__init__()
        self._saves: dict[int, int] = {}

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        fault = os.environ.get(FAIL_SAVE_ENV)
        if fault and os.path.basename(str(path)) == "last.ckpt":
            step = int(checkpoint["global_step"])
            self._saves[step] = self._saves.get(step, 0) + 1
            if fault == f"{step}:{self._saves[step]}":
                raise CheckpointWriteError(f"cannot write checkpoint {path}: No space left on device")
        super().save_checkpoint(checkpoint, path, storage_options)


def row_fingerprints(batch: dict[str, Any]) -> list[str]:
    """One hash per example of a padded batch: its unpadded token ids (every text column) and labels."""
    columns = sorted(k for k, v in batch.items() if isinstance(v, dict))
    size = batch[columns[0]]["input_ids"].shape[0]
    prints = []
    for i in range(size):
        parts = []
        for c in columns:
            ids, mask = batch[c]["input_ids"][i], batch[c]["attention_mask"][i]
            parts.append(ids[mask.bool()].tolist())
        parts.extend(round(float(v[i]), 6) for k, v in sorted(batch.items()) if isinstance(v, torch.Tensor))
        prints.append(hashlib.sha1(json.dumps(parts).encode()).hexdigest()[:16])
    return prints


class RecordExamples(Callback):
    """Append one JSON line per finished training step and rank: the global step, the examples it trained on
    and the learning rate the scheduler set after it.

    Written at the end of the step, so a step killed half-way is not counted; flushed at once,
    so what a SIGKILL leaves behind is complete.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        line = {"pid": os.getpid(), "time": time.time(), "step": trainer.global_step, "epoch": trainer.current_epoch,
                "rank": trainer.global_rank, "world": trainer.world_size, "rows": row_fingerprints(batch),
                "node": os.environ.get("SLURMD_NODENAME"),  # the SLURM node (tests/test_slurm.py), else None
                "lr": trainer.optimizers[0].param_groups[0]["lr"]}  # the rate the next step will use
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


class NonFiniteAtStep(STSRegression):
    """STS regression whose loss turns NaN (or +inf) at one global step, for the divergence test."""

    def __init__(self, *args: Any, bad_step: int = 2, bad_value: float = float("nan"), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bad_step = bad_step
        self.bad_value = bad_value

    def training_loss(self, batch: dict[str, Any]):
        loss, logs = super().training_loss(batch)
        if self.trainer.global_step == self.bad_step:
            loss = loss * self.bad_value
        return loss, {**logs, "mse_part": loss.detach()}


class SlowSteps(Callback):
    """Sleep after every training step, so a signal sent from outside (scancel) lands inside training."""

    def __init__(self, seconds: float = 0.2) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        time.sleep(self.seconds)
