"""Whole-corpus data for FILM: the training sentences once each, index triplets, and the STS dev pairs as text."""
from __future__ import annotations

import itertools
import logging
from typing import Literal

import datasets
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from .base import SentenceDataModule
from .io import DataError
from .nli import load_nli
from .scored import DevSet, load_sts_pairs
from .triplets import NO_TRIPLETS, nli_triplets, triplets_from_scored_pairs

log = logging.getLogger(__name__)


def _index(sentences: dict[str, int], text: str) -> int:
    return sentences.setdefault(text, len(sentences))


def _keep_used(sentences: dict[str, int], triplets: Tensor) -> tuple[list[str], Tensor]:
    """Only the sentences some triplet uses, renumbered 0.. in order of first appearance in the data."""
    used = torch.unique(triplets)  # (n_used,) sorted, so the order of first appearance is kept
    new_id = torch.full((len(sentences),), -1, dtype=torch.long)
    new_id[used] = torch.arange(used.numel())
    text = list(sentences)
    return [text[i] for i in used.tolist()], new_id[triplets]


def nli_index_triplets(parts: list[datasets.Dataset]) -> tuple[list[str], Tensor]:
    """``(sentences, triplets (m, 3))`` from NLI rows: every (premise, entailment, contradiction)
    combination of each premise (``triplets.nli_triplets``); sentences are de-duplicated."""
    sentences: dict[str, int] = {}
    premise, hypothesis, labels = [], [], []
    for ds in parts:
        for p, h, y in zip(ds["premise"], ds["hypothesis"], ds["label"]):
            premise.append(_index(sentences, p))
            hypothesis.append(_index(sentences, h))
            labels.append(y)
    rows = nli_triplets(premise, hypothesis, labels, every_combination=True)
    if not rows:
        raise ValueError(f"{NO_TRIPLETS}: no premise has both an entailment and a contradiction")
    return _keep_used(sentences, torch.tensor(rows, dtype=torch.long))


def sts_index_triplets(parts: list[datasets.Dataset], threshold: float, per_anchor: int,
                       seed: int) -> tuple[list[str], Tensor]:
    """``(sentences, triplets (m, 3))`` from scored pairs: a pair scored ``>= threshold`` (on the [0, 1]
    scale) is a positive, the anchor's partners below it are its negatives, else random sentences
    (``triplets.triplets_from_scored_pairs``)."""
    sentences: dict[str, int] = {}
    pairs, scores = [], []
    for ds in parts:
        for a, b, score in zip(ds["sentence1"], ds["sentence2"], ds["score"]):
            pairs.append((_index(sentences, a), _index(sentences, b)))
            scores.append(score)
    triplets = triplets_from_scored_pairs(pairs, scores, threshold, len(sentences), per_anchor, seed)
    return _keep_used(sentences, triplets)


class _Steps(IterableDataset):
    """0, 1, 2, ...: one item per solver step; the run ends at ``trainer.max_steps`` or on convergence."""

    def __iter__(self):
        return itertools.count()


class _Sentences:
    """Collate rows of a dev set into ``{"sentence": their texts, "rows": (B,)}`` (FILM's encoder reads text)."""

    def __init__(self, sentences: list[str]) -> None:
        self.sentences = sentences

    def __call__(self, rows: list[int]) -> dict:
        return {"sentence": [self.sentences[i] for i in rows], "rows": torch.tensor(rows, dtype=torch.long)}


class FILMDataModule(SentenceDataModule):
    """The whole training corpus at once, for FILM's full-batch solver (``lightning_modules.FILMObjective``).

    FILM never sees batches: in ``setup`` this module builds ``train_sentences`` (each sentence once)
    and ``train_triplets`` ((m, 3) indices into them: anchor i is closer to j than to k), and the
    objective reads them. The train loader only yields step numbers; validation batches are raw text
    (``sentence1``, ``sentence2``: lists of str; ``score``: rescaled gold), since the objective computes its
    own features (TF-IDF or a frozen encoder). Only sentences used by some triplet are kept.

    Args:
        train_sources: NLI sources (premise, hypothesis, label: files or hub splits such as
            ``snli:test``) for ``triplets_from: nli``; STS pair sources (sentence1, sentence2, score)
            for ``triplets_from: sts``. Concatenated.
        triplets_from: ``nli``: every (premise, entailment, contradiction) of a premise; ``sts``: pairs
            scored at least ``sts_threshold`` are positives (see ``sts_index_triplets``).
        sts_threshold: positive-pair threshold on the gold score rescaled to [0, 1] (0.8 = 4 of 5).
        triplets_per_anchor: triplets sampled per anchor sentence for ``sts``.
        sts_dir: directory with ``stsb.dev.tsv`` (and optionally ``sickr.dev.tsv``) for validation.
        val_sources: validation sets, name -> source; ``sts_dir`` overrides the names it provides.
        eval_batch_size: dev pairs per validation batch.
        seed: seed of the ``sts`` triplet sampling; None: the run's seed (see ``SentenceDataModule``).
    """

    def __init__(
        self,
        train_sources: list[str],
        triplets_from: Literal["nli", "sts"] = "nli",
        sts_threshold: float = 0.8,
        triplets_per_anchor: int = 5,
        sts_dir: str | None = None,
        val_sources: dict[str, str] | None = None,
        eval_batch_size: int = 256,
        seed: int | None = None,
    ) -> None:
        super().__init__(eval_batch_size=eval_batch_size, sts_dir=sts_dir, val_sources=val_sources, seed=seed)
        if not train_sources:
            raise ValueError("data.train_sources: at least one source is needed")
        if not 0 <= sts_threshold <= 1:
            raise ValueError(f"data.sts_threshold is on the [0, 1] scale of rescaled gold scores, got {sts_threshold}")
        if triplets_per_anchor < 1:
            raise ValueError(f"data.triplets_per_anchor must be at least 1, got {triplets_per_anchor}")
        self.train_sources = list(train_sources)
        self.triplets_from = triplets_from
        self.sts_threshold = sts_threshold
        self.triplets_per_anchor = triplets_per_anchor
        self.train_sentences: list[str] | None = None
        self.train_triplets: Tensor | None = None

    @property
    def batch_keys(self) -> tuple[str, ...]:
        return ("sentences", "triplets")  # the whole corpus at set-up: FILM has no training batches

    def load_triplets(self) -> tuple[list[str], Tensor]:
        """``(sentences, triplets)`` of the training sources, or a DataError naming them."""
        names = ", ".join(self.train_sources)
        try:
            if self.triplets_from == "nli":
                return nli_index_triplets([load_nli(s) for s in self.train_sources])
            parts = [load_sts_pairs(s) for s in self.train_sources]
            return sts_index_triplets(parts, self.sts_threshold, self.triplets_per_anchor, self.batch_seed)
        except DataError:
            raise
        except ValueError as err:  # the triplet builders' "no triplets could be generated ..."
            raise DataError(f"{names}: {err}") from None

    def setup(self, stage: str | None = None) -> None:
        if self.trainer is not None and self.trainer.lightning_module is not None:
            self.check_objective(self.trainer.lightning_module)  # before any work
        # "validate" too: FILM's start model (its spectral initialisation) is defined by the training data
        if stage in (None, "fit", "validate") and self.train_sentences is None:
            self.train_sentences, self.train_triplets = self.load_triplets()
            log.info("FILM data: %d sentences, %d triplets, %d anchors from %s", len(self.train_sentences),
                     len(self.train_triplets), torch.unique(self.train_triplets[:, 0]).numel(),
                     ", ".join(self.train_sources))
        if stage in (None, "fit", "validate") and not self.dev_sets:
            for name, source in self.validation_sources().items():
                self.dev_sets[name] = DevSet.from_pairs(load_sts_pairs(source))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Steps(), batch_size=None)

    def val_dataloader(self) -> list[DataLoader]:
        return [
            DataLoader(range(len(dev.sentences)), batch_size=self.eval_batch_size, shuffle=False,
                       collate_fn=_Sentences(dev.sentences))
            for dev in self.dev_sets.values()
        ]
