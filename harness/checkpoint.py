"""Checkpoints written whole or not at all, and the newest readable one found for a resume.

Reading a checkpoint safely (no arbitrary pickles) is ``encoders/checkpoint_file.py``, rebuilding its encoder ``encoders/checkpoint.py``."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Any, Iterable, Optional

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from encoders.checkpoint_file import CheckpointError, load_checkpoint

__all__ = ["AtomicCheckpointIO", "CheckpointError", "CheckpointWriteError", "NotEnoughSpaceError", "check_free_space",
           "checkpoint_size", "load_checkpoint", "resume_checkpoint"]

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
        writer = None
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(tmp, "wb") as f:
                writer = _RecordingWriter(f)
                torch.save(checkpoint, writer)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as err:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            cause = _os_error(err, writer.error if writer is not None else None) if isinstance(err, Exception) else None
            if cause is not None:
                raise CheckpointWriteError(f"cannot write checkpoint {path}: {cause.strerror or cause}") from err
            raise

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        if "://" in str(path):
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        return load_checkpoint(str(path))


class _RecordingWriter:
    """The file object torch.save writes to, keeping the operating system's error of a failed write.

    torch's zip writer calls ``write`` from C++ and turns its ``OSError`` (no space left, file too
    large, quota) into ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos ...``;
    the reason is kept here, whatever that layer does with it."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._file.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        self._file.flush()


def _os_error(err: BaseException, recorded: OSError | None) -> OSError | None:
    """The operating system's error behind a failed save: the exception itself, one it was raised
    from or during, or the one the writer recorded. None for anything else (a bug, an interrupt)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return recorded


def checkpoint_size(module: torch.nn.Module) -> int:
    """Bytes of a training checkpoint of ``module``, estimated before any exists: every tensor of
    its state dict, plus Adam's two moments of each trainable parameter (the project's optimizers
    are Adam and AdamW). The rest of a checkpoint (loop counters, configs) is a few kilobytes."""
    weights = sum(t.numel() * t.element_size() for t in module.state_dict().values() if isinstance(t, torch.Tensor))
    moments = sum(2 * p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return weights + moments


class NotEnoughSpaceError(ValueError):
    """The checkpoint directory's file system has less free space than one checkpoint needs."""


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB"


def check_free_space(directory: str, module: torch.nn.Module) -> None:
    """Fail before any work when ``directory`` cannot hold one more checkpoint of ``module``:
    each save writes a whole new file before the old one is replaced."""
    if "://" in directory:
        return  # remote storage: nothing cheap to check
    existing = directory
    while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)  # not created yet: the file system it will be on
    free, needed = shutil.disk_usage(existing).free, checkpoint_size(module)
    if free < needed:
        raise NotEnoughSpaceError(f"{directory}: {_mib(free)} free, but a checkpoint of this model needs about "
                                  f"{_mib(needed)}; free at least {_mib(needed - free)} there")


def resume_checkpoint(directories: Iterable[str]) -> tuple[str, dict] | None:
    """The checkpoint ``--ckpt_path last`` resumes from, with its contents (tensors memory-mapped), or None.

    Of the readable ``*.ckpt`` files in these directories, the one furthest into training: the highest
    ``global_step``; at the same step, ``last.ckpt`` (the file a run writes to be resumed from), then the newest.
    So a ``best-*`` checkpoint written after ``last.ckpt`` at the same step (ModelCheckpoint after a
    validation), or one touched later, never wins over a later step; a checkpoint of the same step holds the
    same weights, optimizer, data position and random state whichever file it is. Unreadable files (truncated
    by a crash) are skipped with a warning; ``nonfinite-*`` checkpoints (the last finite state before a NaN)
    are never taken: resuming there would meet the same NaN (give the file itself to start from it).
    """
    candidates = [os.path.join(d, name) for d in dict.fromkeys(directories) if os.path.isdir(d)
                  for name in os.listdir(d) if name.endswith(".ckpt") and not name.startswith("nonfinite-")]
    readable = []
    for path in candidates:
        try:
            checkpoint = load_checkpoint(path, mmap=True)
        except CheckpointError as err:
            log.warning("skipping an unreadable checkpoint: %s", err)
            continue
        readable.append((int(checkpoint.get("global_step", -1)), os.path.basename(path) == "last.ckpt",
                         os.path.getmtime(path), path, checkpoint))
    if not readable:
        return None
    *_, path, checkpoint = max(readable, key=lambda item: item[:3])
    return path, checkpoint
