"""What a checkpoint needs beyond the weights and the loops for a resumed run to continue exactly: every rank's
random generators, and the epoch and batch count the data's batch sampler draws from."""
from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback


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
