"""Loading a trained encoder from a checkpoint alone, safely (no arbitrary pickles)."""
from __future__ import annotations

import os
import pickle
import zipfile

import torch

from .encoder import SentenceEncoder


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, not a checkpoint, or not one of this project."""


def load_checkpoint(path: str) -> dict:
    """``torch.load(weights_only=True)`` with errors that name the file."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or another format): {err}") from None


def encoder_from_checkpoint(path: str) -> tuple[SentenceEncoder, dict]:
    """Rebuild the trained encoder from the configuration and weights stored in a checkpoint."""
    checkpoint = load_checkpoint(path)
    if "encoder_config" not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path}: not a checkpoint of this project (no encoder_config/state_dict)")
    encoder = SentenceEncoder.from_checkpoint_config(checkpoint["encoder_config"])
    prefix = "encoder."
    state = {k[len(prefix):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    # Position-id buffers are rebuilt by the model; anything else missing is an error.
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise CheckpointError(f"{path}: encoder weights do not match its config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    encoder.eval()
    return encoder, checkpoint
