"""Unlabelled sentences, one per line (SimCSE's ``wiki1m_for_simcse.txt``) or a hub text column."""
from __future__ import annotations

import logging

import datasets
import numpy as np

from .base import SentenceDataModule
from .io import check_text_columns, drop_rows, load_source, require_columns, sentence_ids

log = logging.getLogger(__name__)


class WikiDataModule(SentenceDataModule):
    """Single sentences for unsupervised objectives (SimCSE, DCLR).

    Batch keys: ``sentence`` (tokenized). Batches never repeat a sentence and drop the last
    incomplete batch, since the other sentences of a batch are its negatives.

    Args:
        train_source: a text file with one sentence per line, or a hub split ``name[:config]:split``.
        text_column: the column holding the sentence for hub or JSON sources.
        skip_empty: drop empty lines (counted in the log) instead of failing on the first one.
        max_sentences: use only the first N sentences (short runs); None = all.
        fraction: train on this share of the sentences, in (0, 1] (DCLR's data-fraction experiment): a
            random subset, kept in file order, of ``round(fraction * N)`` sentences (at least one). The
            draw depends only on ``fraction_seed`` and N, and the subsets are nested: every sentence of
            a smaller fraction is in each larger one. Applied after ``skip_empty``, before ``max_sentences``.
        fraction_seed: seed of that draw (not the run's seed, so that runs of several seeds at one
            fraction train on the same sentences).
    """

    text_columns = ("sentence",)

    def __init__(
        self,
        train_source: str,
        text_column: str = "text",
        skip_empty: bool = False,
        max_sentences: int | None = None,
        fraction: float = 1.0,
        fraction_seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not 0 < fraction <= 1:
            raise ValueError(f"data.fraction must be in (0, 1], got {fraction}")
        self.train_source = train_source
        self.text_column = text_column
        self.skip_empty = skip_empty
        self.max_sentences = max_sentences
        self.fraction = fraction
        self.fraction_seed = fraction_seed

    def load_train_rows(self) -> datasets.Dataset:
        ds = load_source(self.train_source, text_column=self.text_column)
        require_columns(ds, [self.text_column], self.train_source)
        if self.skip_empty:
            keep = [bool(t and t.strip()) for t in ds[self.text_column]]
            ds = drop_rows(ds, keep, self.train_source, "empty line, skipped on request (data.skip_empty)")
        check_text_columns(ds, [self.text_column], self.train_source)
        if self.fraction < 1:
            ds = ds.select(fraction_rows(len(ds), self.fraction, self.fraction_seed))
            log.info("%s: training on %d sentences, a %g share (data.fraction)", self.train_source, len(ds), self.fraction)
        if self.max_sentences is not None:
            ds = ds.select(range(min(self.max_sentences, len(ds))))
        return ds.select_columns([self.text_column]).rename_column(self.text_column, "sentence") \
            if self.text_column != "sentence" else ds.select_columns(["sentence"])

    def unique_keys(self, ds: datasets.Dataset):
        return sentence_ids(ds, ["sentence"])  # (N, 1): equal sentences, equal ids


def fraction_rows(n: int, fraction: float, seed: int) -> list[int]:
    """The rows of a ``fraction`` share of ``n``: the first ``round(fraction * n)`` (at least one) of one
    seeded permutation, so a smaller fraction's rows are a subset of a larger one's; in file order."""
    keep = max(1, round(fraction * n))
    return np.sort(np.random.default_rng(seed).permutation(n)[:keep]).tolist()
