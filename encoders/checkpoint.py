"""Rebuilding a checkpoint's trained encoder (reading the file itself is ``encoders/checkpoint_file.py``)."""
from __future__ import annotations

from torch import nn

from .checkpoint_file import CheckpointError, _encoder_state, encoder_class_name, load_checkpoint, load_encoder_weights
from .sentence import SentenceEncoder

__all__ = ["CheckpointError", "encoder_classes", "encoder_from_checkpoint", "load_checkpoint"]


def encoder_classes() -> dict[str, type[nn.Module]]:
    """The encoders a checkpoint may name (``encoder_class``): never an arbitrary import path from a file."""
    from .film import FILMEncoder  # scikit-learn and scipy (the [film] extra): only when asked

    return {"SentenceEncoder": SentenceEncoder, "FILMEncoder": FILMEncoder}


def encoder_from_checkpoint(path: str) -> tuple[nn.Module, dict]:
    """Rebuild the trained encoder from the class, configuration and weights stored in a checkpoint
    (a ``FILMEncoder`` for FILM runs: same ``encode`` interface)."""
    checkpoint = load_checkpoint(path)
    name = encoder_class_name(checkpoint, path)
    if name not in encoder_classes():
        raise CheckpointError(f"{path}: encoder class {name!r} is not one of this project's {sorted(encoder_classes())}")
    encoder = encoder_classes()[name].from_checkpoint_config(checkpoint["encoder_config"])
    load_encoder_weights(encoder, _encoder_state(checkpoint), path)
    encoder.eval()
    return encoder, checkpoint
