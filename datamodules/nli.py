"""SNLI / MultiNLI (any mix) as labelled pairs, entailment pairs, or (anchor, entailment, contradiction) triplets."""
from __future__ import annotations

import logging
from typing import Literal

import datasets

from .base import SentenceDataModule
from .io import (DataError, check_text_columns, describe_row, drop_rows, load_source, quiet_progress, require_columns,
                 sentence_ids)
from .triplets import nli_triplets

log = logging.getLogger(__name__)

LABELS = ("entailment", "neutral", "contradiction")  # class ids 0, 1, 2 (the hub's SNLI/MNLI order)


def load_nli(source: str) -> datasets.Dataset:
    """premise, hypothesis, label (int in 0..2); hub rows without a gold label (-1) are dropped and counted."""
    ds = load_source(source)
    require_columns(ds, ["premise", "hypothesis", "label"], source)
    feature = ds.features["label"]
    if isinstance(feature, datasets.ClassLabel) or feature.dtype.startswith("int"):
        names = feature.names if isinstance(feature, datasets.ClassLabel) else list(LABELS)
        if list(names) != list(LABELS):
            raise DataError(f"{source}: label names {names} are not {list(LABELS)}")
        labels = ds["label"]
        ds = drop_rows(ds, [y != -1 for y in labels], source, "no gold label (-1)")
        bad = next((i for i, y in enumerate(ds["label"]) if not 0 <= y < len(LABELS)), None)
        if bad is not None:
            raise DataError(f"{describe_row(source, bad)}: label {ds['label'][bad]} is not in 0..2")
        check_text_columns(ds, ["premise", "hypothesis"], source)
        return ds.select_columns(["premise", "hypothesis", "label"])
    check_text_columns(ds, ["premise", "hypothesis"], source)
    ids = []
    for row, label in enumerate(ds["label"]):
        key = (label or "").strip().lower()
        if key not in LABELS:
            raise DataError(f"{describe_row(source, row)}: label {label!r} is not one of {', '.join(LABELS)}")
        ids.append(LABELS.index(key))
    return ds.select_columns(["premise", "hypothesis"]).add_column("label", ids)


class NLIDataModule(SentenceDataModule):
    """NLI training data in the view an objective needs.

    Batch keys by ``view``:
      - ``labelled``: ``sentence1``, ``sentence2`` (tokenized), ``label`` (0 entailment, 1 neutral, 2 contradiction)
      - ``pairs``: ``anchor``, ``positive`` (entailment pairs)
      - ``triplets``: ``anchor``, ``positive``, ``negative`` (entailment and contradiction of one premise);
        with ``num_negatives`` n > 1, ``anchor``, ``positive``, ``negative_1`` ... ``negative_n`` from a
        file mined by ``mine.py`` (``datamodules.mining``)

    Args:
        train_sources: local files (premise, hypothesis, label TSV/JSONL) or hub splits such as
            ``snli:train`` and ``multi_nli:train``, concatenated. A file that already has
            ``anchor, positive[, negative]`` columns (any pair or triplet file) is used as is, and so is a
            mined file's ``anchor, positive, negative_1 ... negative_n`` (its first ``num_negatives``
            negatives are read; with one, ``negative_1`` is the ``negative`` key).
        view: which of the three views above.
        num_negatives: hard negatives per row in the ``triplets`` view; more than one needs mined files.
    """

    def __init__(
        self,
        train_sources: list[str],
        view: Literal["labelled", "pairs", "triplets"] = "labelled",
        num_negatives: int = 1,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not train_sources:
            raise ValueError("data.train_sources: at least one source is needed")
        if num_negatives < 1:
            raise ValueError(f"data.init_args.num_negatives must be at least 1, got {num_negatives}")
        if num_negatives > 1 and view != "triplets":
            raise ValueError(f"data.init_args.num_negatives={num_negatives} needs view: triplets (got {view!r})")
        self.train_sources = list(train_sources)
        self.view = view
        self.num_negatives = num_negatives
        negatives = ("negative",) if num_negatives == 1 else tuple(f"negative_{i}" for i in range(1, num_negatives + 1))
        self.text_columns = {"labelled": ("sentence1", "sentence2"), "pairs": ("anchor", "positive"),
                             "triplets": ("anchor", "positive", *negatives)}[view]
        self.label_columns = ("label",) if view == "labelled" else ()

    def _load_one(self, source: str) -> datasets.Dataset:
        ds = load_source(source)
        if "anchor" in ds.column_names:  # a ready-made pair/triplet file, or a mined one
            need = list(self.text_columns)
            if self.view == "labelled":
                raise DataError(f"{source}: has anchor/positive columns, but view 'labelled' needs premise, hypothesis, label")
            if need[-1] == "negative" and "negative" not in ds.column_names and "negative_1" in ds.column_names:
                ds = ds.rename_column("negative_1", "negative")  # a mined file read with one negative
            require_columns(ds, need, source)
            check_text_columns(ds, need, source)
            return ds.select_columns(need)
        if self.num_negatives > 1:
            raise DataError(f"{source}: an NLI file gives one contradiction per row; data.init_args.num_negatives="
                            f"{self.num_negatives} needs a file with columns anchor, positive, negative_1 ... "
                            f"negative_{self.num_negatives} (python mine.py writes one)")
        ds = load_nli(source)
        if self.view == "labelled":
            return ds.rename_columns({"premise": "sentence1", "hypothesis": "sentence2"})
        if self.view == "pairs":
            with quiet_progress():
                ds = ds.filter(lambda y: [v == 0 for v in y], input_columns="label", batched=True)
            return ds.rename_columns({"premise": "anchor", "hypothesis": "positive"}).select_columns(["anchor", "positive"])
        rows = nli_triplets(ds["premise"], ds["hypothesis"], ds["label"])
        triplets = datasets.Dataset.from_dict({c: [r[i] for r in rows] for i, c in enumerate(self.text_columns)})
        log.info("%s: %d triplets from %d labelled pairs", source, len(triplets), len(ds))
        return triplets

    def load_train_rows(self) -> datasets.Dataset:
        parts = [self._load_one(s) for s in self.train_sources]
        ds = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
        if len(ds) == 0:
            raise DataError(f"{', '.join(self.train_sources)}: no {self.view} rows could be built")
        return ds

    def unique_keys(self, ds: datasets.Dataset):
        if not self.unique_sentences:
            return None
        return sentence_ids(ds, self.text_columns)  # (N, columns): a sentence has one id in every column
