"""Scored sentence pairs: reading an STS file or hub split, and a dev set as its distinct sentences.

Both the STS data module (regression on STS-B) and every module's validation read pairs here; a dev
set is then encoded as the STS evaluation encodes its tasks, each distinct sentence once
(``harness/sts_eval.py``): SICK-R's dev pairs hold 1,000 sentences of which about 800 are distinct.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import datasets
import torch
from torch import Tensor

from .io import check_text_columns, is_hub_file, is_local, load_source, parse_hub_file, parse_scores, require_columns

# Hub datasets that name the STS columns differently (SICK's own names, as in the hub's RobZamp/sick).
STS_COLUMN_ALIASES = {"sentence_A": "sentence1", "sentence_B": "sentence2", "relatedness_score": "score"}


def score_range_of(source: str) -> tuple[float, float]:
    """Documented gold-score ranges: SICK-R 1-5, the hub's normalised STS-B 0-1, other STS 0-5.

    A local file is known by its name (``sickr.dev.tsv``), a hub source by its repository and path.
    """
    if is_local(source):
        repo, name = None, os.path.basename(source).lower()
    elif is_hub_file(source):
        repo, _, path = parse_hub_file(source)
        repo, name = repo.lower(), f"{repo}/{path}".lower()
    else:
        repo = name = source.split(":")[0].lower()
    if "sick" in name:
        return (1.0, 5.0)
    if repo == "sentence-transformers/stsb":
        return (0.0, 1.0)
    return (0.0, 5.0)


def load_sts_pairs(source: str, score_range: tuple[float, float] | None = None) -> datasets.Dataset:
    """An STS file or hub split as columns sentence1, sentence2, score (rescaled to [0, 1])."""
    ds = load_source(source)
    aliases = {k: v for k, v in STS_COLUMN_ALIASES.items() if k in ds.column_names and v not in ds.column_names}
    ds = ds.rename_columns(aliases) if aliases else ds
    require_columns(ds, ["sentence1", "sentence2", "score"], source)
    check_text_columns(ds, ["sentence1", "sentence2"], source)
    low, high = score_range or score_range_of(source)
    scores = [(s - low) / (high - low) for s in parse_scores(ds, "score", source, low, high)]
    ds = ds.select_columns(["sentence1", "sentence2"])
    return ds.add_column("score", scores)


@dataclass
class DevSet:
    """A dev set as validation encodes it: each distinct sentence once, and the pairs as rows of them."""

    sentences: list[str]  # distinct, in order of first appearance
    pairs: Tensor  # (N, 2) long: rows of ``sentences``
    scores: Tensor  # (N,) float, gold scores on [0, 1]

    @classmethod
    def from_pairs(cls, ds: datasets.Dataset) -> "DevSet":
        rows: dict[str, int] = {}
        index = [(rows.setdefault(a, len(rows)), rows.setdefault(b, len(rows)))
                 for a, b in zip(ds["sentence1"], ds["sentence2"])]
        return cls(list(rows), torch.tensor(index, dtype=torch.long).reshape(-1, 2),
                   torch.tensor(ds["score"], dtype=torch.float32))
