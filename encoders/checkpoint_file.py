"""Reading a checkpoint file safely (``weights_only``: no arbitrary pickles), and the encoder weights in it.

Building an encoder from a checkpoint is ``encoders/checkpoint.py``; this module stands below the encoders, so a
``SentenceEncoder`` can start from a checkpoint's weights without importing what builds it.
"""
from __future__ import annotations

import os
import pickle
import zipfile

import torch
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, not a checkpoint, or not one of this project."""


def load_checkpoint(path: str, mmap: bool = False) -> dict:
    """``torch.load(weights_only=True)`` with errors that name the file.

    ``mmap=True`` maps the tensors instead of reading them: a cheap check that a file is a whole
    checkpoint, and a look at its metadata.
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: checkpoint file not found")
    unreadable = f"{path}: not a readable checkpoint (truncated or another format)"
    if not zipfile.is_zipfile(path):  # its directory is at the end: a cut-off file has none
        raise CheckpointError(f"{unreadable}: not a whole zip archive, as torch.save writes")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"{unreadable}: {_reason(err)}") from None


def _reason(err: BaseException) -> str:
    """One line out of torch's several-paragraph messages (which suggest weights_only=False)."""
    text = str(err)
    if "Unsupported global" in text:
        name = text.split("Unsupported global: ", 1)[1].split()[1]
        return f"it holds a pickled {name}, and pickled objects are never loaded (they could run code)"
    return text.strip().splitlines()[0].split(". ")[0] if text.strip() else type(err).__name__


def encoder_class_name(checkpoint: dict, path: str) -> str:
    """The encoder class a checkpoint of this project holds; an error when it is not one of this project."""
    if "encoder_config" not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path}: not a checkpoint of this project (no encoder_config/state_dict)")
    config = checkpoint["encoder_config"]
    # Checkpoints written before encoder_class was stored mark FILM's encoder in its config.
    return checkpoint.get("encoder_class") or ("FILMEncoder" if config.get("type") == "film" else "SentenceEncoder")


def _encoder_state(checkpoint: dict) -> dict:
    prefix = "encoder."
    return {k[len(prefix):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}


def load_encoder_weights(encoder: nn.Module, state: dict, path: str) -> None:
    """Load a checkpoint's encoder weights; every weight must find its place."""
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    # Position-id buffers are rebuilt by the model; anything else missing is an error.
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise CheckpointError(f"{path}: encoder weights do not match its config (missing {missing[:3]}, unexpected {unexpected[:3]})")


START_ARCHITECTURE = ("pooling", "mlp_head", "mlp_only_train", "projection_dim")


def sentence_encoder_start(path: str, architecture: dict) -> tuple[str, dict]:
    """What a ``SentenceEncoder`` named by a checkpoint of this project starts from: the transformer
    the checkpoint was built on (its ``model_name``) and the trained encoder weights.

    ``architecture`` (pooling and heads, ``START_ARCHITECTURE``) must be the checkpoint's: a
    continued run that pooled differently would start from weights trained for another sentence
    vector, so a difference is an error that names the setting to change.
    """
    checkpoint = load_checkpoint(path)
    name, config = encoder_class_name(checkpoint, path), checkpoint["encoder_config"]
    if name != "SentenceEncoder":
        raise CheckpointError(f"{path}: holds a {name}; a SentenceEncoder starts only from a SentenceEncoder's checkpoint")
    for key in START_ARCHITECTURE:
        trained = config.get(key, False if key.startswith("mlp") else None)
        if architecture[key] != trained:
            raise CheckpointError(f"{path}: was trained with {key} {trained!r}, this encoder asks for "
                                  f"{architecture[key]!r}; set encoder.init_args.{key}: {trained} to start from it")
    return config["model_name"], _encoder_state(checkpoint)
