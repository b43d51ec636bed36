"""Callbacks the CLI adds to every run."""
from __future__ import annotations

import os

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint


class SaveFinalState(Callback):
    """Write ``last.ckpt`` when training ends between two validations.

    ModelCheckpoint saves after each validation; a run that stops at ``max_steps`` between two
    of them would otherwise lose its final steps.
    """

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        checkpoint = trainer.checkpoint_callback
        if not isinstance(checkpoint, ModelCheckpoint) or not checkpoint.save_last or checkpoint.dirpath is None:
            return
        if checkpoint._last_global_step_saved == trainer.global_step:
            return
        path = os.path.join(checkpoint.dirpath, f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}")
        trainer.save_checkpoint(path)
        checkpoint.last_model_path = path
