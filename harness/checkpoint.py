"""Checkpoints written whole or not at all, and the newest readable one found for a resume.

Reading a checkpoint safely (no arbitrary pickles) and rebuilding its encoder is ``encoders/checkpoint.py``."""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterable, Optional

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from encoders.checkpoint import CheckpointError, load_checkpoint

__all__ = ["AtomicCheckpointIO", "CheckpointError", "CheckpointWriteError", "load_checkpoint", "newest_checkpoint"]

log = logging.getLogger(__name__)


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, no permission, ...); earlier ones are intact."""


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
