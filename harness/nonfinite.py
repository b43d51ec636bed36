"""A stop at the first NaN or infinite loss, with the last finite state saved beside the run's checkpoints."""
from __future__ import annotations

import os

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from .checkpointing import checkpoint_dir


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
