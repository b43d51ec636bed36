"""Checkpoints read safely (no arbitrary pickles) and written whole or not at all; loading a
trained encoder from a checkpoint alone."""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import zipfile
from typing import Any, Iterable, Optional

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from .encoder import SentenceEncoder

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, not a checkpoint, or not one of this project."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, no permission, ...); earlier ones are intact."""


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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer and reader for every run of the CLI.

    Writing: to ``<path>.tmp`` in the same directory, flushed to disk, then renamed over ``path``
    (``os.replace`` is atomic within a file system), so a run killed while writing leaves the
    previous checkpoint whole. Lightning's own writer stages the file in the system temporary
    directory and moves it, which is a copy, not a rename, when that is another file system
    (as on most clusters). A failed write says which file and why (``CheckpointWriteError``).

    Reading (``--ckpt_path``): always ``weights_only=True``, whatever the caller asks for, with
    errors that name the file.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        path = str(path)
        if "://" in path:  # remote storage: fsspec's own transactions
            return super().save_checkpoint(checkpoint, path, storage_options)
        tmp = f"{path}.tmp"
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(tmp, "wb") as f:  # a file object: a full disk raises OSError, not a C++ error
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as err:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            if isinstance(err, OSError):
                raise CheckpointWriteError(f"cannot write checkpoint {path}: {err.strerror or err}") from err
            raise

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        if "://" in str(path):
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        return load_checkpoint(str(path))


def newest_checkpoint(directories: Iterable[str]) -> tuple[str, dict] | None:
    """The most recently written readable ``*.ckpt`` in these directories, with its contents
    (tensors memory-mapped); unreadable ones, such as a file truncated by a crash, are skipped
    with a warning. None when there is none."""
    candidates = [os.path.join(d, name) for d in dict.fromkeys(directories) if os.path.isdir(d)
                  for name in os.listdir(d) if name.endswith(".ckpt")]
    for path in sorted(candidates, key=os.path.getmtime, reverse=True):
        try:
            return path, load_checkpoint(path, mmap=True)
        except CheckpointError as err:
            log.warning("skipping an unreadable checkpoint: %s", err)
    return None


def encoder_from_checkpoint(path: str) -> tuple[SentenceEncoder, dict]:
    """Rebuild the trained encoder from the configuration and weights stored in a checkpoint
    (a ``FILMEncoder`` for FILM runs: same ``encode`` interface)."""
    checkpoint = load_checkpoint(path)
    if "encoder_config" not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path}: not a checkpoint of this project (no encoder_config/state_dict)")
    config = checkpoint["encoder_config"]
    if config.get("type") == "film":  # FILM's learned map over TF-IDF or frozen-encoder features
        from .film import FILMEncoder

        encoder = FILMEncoder.from_checkpoint_config(config)
    else:
        encoder = SentenceEncoder.from_checkpoint_config(config)
    prefix = "encoder."
    state = {k[len(prefix):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    # Position-id buffers are rebuilt by the model; anything else missing is an error.
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise CheckpointError(f"{path}: encoder weights do not match its config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    encoder.eval()
    return encoder, checkpoint
