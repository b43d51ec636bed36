"""Labelled sentence pairs for duplicate detection (FILM's pairwise kNN task): ``sentence1, sentence2, label``.

Two ways in:

- ``load_labelled_pairs(source)``: a pair source with a 0/1 ``label`` (1 = same meaning). Quora
  Question Pairs come from the hub as GLUE's parquet copy, ``nyu-mll/glue:qqp:train`` (and
  ``:validation``), whose columns ``question1, question2, label, idx`` are mapped here; its test
  split has no gold labels (-1), and such rows are dropped and counted in the log.
- ``sts_duplicate_pairs(source)``: an STS file (``sentence1, sentence2, score`` on 0-5) turned into
  labelled pairs by a fixed rule, gold ``>= 4`` a duplicate (1), gold ``<= 1`` not (0), the pairs in
  between dropped (they are neither), for working without the hub on STS-B's published splits.
"""
from __future__ import annotations

from typing import NamedTuple

from .io import DataError, check_text_columns, describe_row, drop_rows, load_source, parse_scores, require_columns

PAIR_COLUMN_ALIASES = {"question1": "sentence1", "question2": "sentence2"}  # GLUE QQP (nyu-mll/glue, qqp)
STS_DUPLICATE, STS_NOT_DUPLICATE = 4.0, 1.0  # gold-score cut-offs of sts_duplicate_pairs (0-5 scale)


class LabelledPairs(NamedTuple):
    sentence1: list[str]
    sentence2: list[str]
    label: list[int]  # 1 duplicate, 0 not


def load_labelled_pairs(source: str) -> LabelledPairs:
    """Pairs with a 0/1 label from a local file or a hub split (QQP's column names accepted)."""
    ds = load_source(source)
    aliases = {k: v for k, v in PAIR_COLUMN_ALIASES.items() if k in ds.column_names and v not in ds.column_names}
    ds = ds.rename_columns(aliases) if aliases else ds
    require_columns(ds, ["sentence1", "sentence2", "label"], source)
    labels = []
    for row, value in enumerate(ds["label"]):
        try:
            labels.append(int(str(value).strip()))
        except ValueError:
            raise DataError(f"{describe_row(source, row)}: label {value!r} is not 0 or 1") from None
    ds = drop_rows(ds, [y != -1 for y in labels], source, "no gold label (-1)")
    labels = [y for y in labels if y != -1]
    bad = next((i for i, y in enumerate(labels) if y not in (0, 1)), None)
    if bad is not None:
        raise DataError(f"{describe_row(source, bad)}: label {labels[bad]} is not 0 or 1")
    if not labels:
        raise DataError(f"{source}: no labelled pairs")
    check_text_columns(ds, ["sentence1", "sentence2"], source)
    return LabelledPairs(list(ds["sentence1"]), list(ds["sentence2"]), labels)


def sts_duplicate_pairs(source: str) -> LabelledPairs:
    """STS pairs as duplicates (gold >= 4 of 5) and non-duplicates (gold <= 1); the rest are dropped."""
    ds = load_source(source)
    require_columns(ds, ["sentence1", "sentence2", "score"], source)
    check_text_columns(ds, ["sentence1", "sentence2"], source)
    scores = parse_scores(ds, "score", source, 0.0, 5.0)
    keep = [s >= STS_DUPLICATE or s <= STS_NOT_DUPLICATE for s in scores]
    ds = drop_rows(ds, keep, source, f"gold score between {STS_NOT_DUPLICATE:g} and {STS_DUPLICATE:g}: "
                   "neither duplicate nor not")
    labels = [int(s >= STS_DUPLICATE) for s, k in zip(scores, keep) if k]
    return LabelledPairs(list(ds["sentence1"]), list(ds["sentence2"]), labels)
