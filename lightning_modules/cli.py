"""The command line shared by train.py: LightningCLI with the project's defaults, and clear errors."""
from __future__ import annotations

import functools
import os
import sys
from typing import Callable, Optional

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from datamodules import SentenceDataModule
from datamodules.io import DataError

from .base import SentenceEmbeddingModule
from .callbacks import SaveFinalState
from .hub import ModelResolutionError


class SentenceCLI(LightningCLI):
    """``python train.py --config configs/X.yaml [--key value ...]``.

    Any objective (``model.class_path``) and DataModule (``data.class_path``) of the project;
    the best checkpoint is kept by ``val/stsb_spearman`` (``--checkpoint.monitor`` changes it).
    A typo in a key or a wrong type fails before any work, naming the key.
    """

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("save_config_kwargs", {"overwrite": False})
        super().__init__(
            SentenceEmbeddingModule, SentenceDataModule, subclass_mode_model=True, subclass_mode_data=True,
            run=False, **kwargs,
        )

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--ckpt_path", type=Optional[str], default=None,
                            help="checkpoint to resume from ('last' = the newest in this run directory)")
        parser.add_argument("--validate_first", type=bool, default=True,
                            help="validate the start model before training (the step-0 point of every val/ curve)")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(SaveFinalState, "save_final_state")
        parser.set_defaults({
            "checkpoint.monitor": "val/stsb_spearman",
            "checkpoint.mode": "max",
            "checkpoint.save_last": True,
            "checkpoint.filename": "best-step{step}-stsb{val/stsb_spearman:.2f}",
            "checkpoint.auto_insert_metric_name": False,
            # Our batch sampler shards by rank itself, so every rank keeps the full dev set.
            "trainer.use_distributed_sampler": False,
        })


USER_ERRORS = (DataError, ModelResolutionError, ValueError, FileNotFoundError, FileExistsError, PermissionError)


def exit_on_user_error(main: Callable[[], object]) -> Callable[[], object]:
    """Bad input ends with one line naming the file, line or key, and exit code 2.

    Set ``SENTEMB_DEBUG=1`` to see the full traceback instead.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except USER_ERRORS as err:
            if os.environ.get("SENTEMB_DEBUG"):
                raise
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    return wrapper
