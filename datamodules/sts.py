"""STS data: STS-B (or SICK-R) training pairs for regression, and the seven evaluation tasks."""
from __future__ import annotations

import glob
import os

import datasets

from .base import SentenceDataModule, load_sts_pairs
from .io import DataError

STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")


def sts_task_files(sts_dir: str, task: str) -> dict[str, str]:
    """Subset name -> file of one evaluation task in an STS directory.

    STS12-16: every ``<task>.<subset>.tsv``; STS-B and SICK-R: the test split.
    """
    if task not in STS_TASKS:
        raise DataError(f"unknown STS task {task!r}; choose from {', '.join(STS_TASKS)}")
    if not os.path.isdir(sts_dir):
        raise DataError(f"{sts_dir}: STS directory not found")
    if task in ("stsb", "sickr"):
        path = os.path.join(sts_dir, f"{task}.test.tsv")
        if not os.path.isfile(path):
            raise DataError(f"{path}: data file not found")
        return {"test": path}
    files = sorted(glob.glob(os.path.join(sts_dir, f"{task}.*.tsv")))
    if not files:
        raise DataError(f"{sts_dir}: no {task}.<subset>.tsv files found")
    return {os.path.basename(f)[len(task) + 1:-len(".tsv")]: f for f in files}


class STSDataModule(SentenceDataModule):
    """Scored sentence pairs for regression (SBERT's STS-B fine-tuning).

    Batch keys: ``sentence1``, ``sentence2`` (tokenized), ``score`` (gold score rescaled to [0, 1]).

    Args:
        train_source: an STS file (``stsb.train.tsv``, header sentence1, sentence2, score, extra
            columns ignored) or hub split (``sentence-transformers/stsb:train``).
        score_range: the gold scale; by default 0-5, 1-5 for SICK files, 0-1 for the hub STS-B.
    """

    text_columns = ("sentence1", "sentence2")
    label_columns = ("score",)

    def __init__(self, train_source: str, score_range: tuple[float, float] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.train_source = train_source
        self.score_range = score_range

    def load_train_rows(self) -> datasets.Dataset:
        return load_sts_pairs(self.train_source, self.score_range)
