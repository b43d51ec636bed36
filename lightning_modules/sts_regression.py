"""SBERT's STS regression objective."""
from __future__ import annotations

from typing import Any

from torch import Tensor

from .base import SentenceEmbeddingModule
from .losses import cosine_mse_loss


class STSRegression(SentenceEmbeddingModule):
    """cos(u, v) regressed on the gold similarity rescaled to [0, 1], with MSE
    (Reimers & Gurevych, EMNLP 2019, section 3).

    Batch keys: ``sentence1``, ``sentence2`` (tokenized), ``score`` in [0, 1]: ``STSDataModule``.
    Paper defaults: bert-base-uncased, mean pooling, batch 16, Adam lr 2e-5, 10% linear warmup,
    4 epochs over STS-B train.

    ``matryoshka_dims`` (base class) sums the loss over truncated embeddings, each renormalised by the
    cosine (Kusupati et al. 2022).
    """

    batch_keys = ("sentence1", "sentence2", "score")
    supports_matryoshka = True

    def training_loss(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        def loss_fn(embeddings: list[Tensor]) -> Tensor:
            u, v = embeddings  # (B, H) each
            return cosine_mse_loss(u, v, batch["score"])

        return self.embedding_loss([batch["sentence1"], batch["sentence2"]], loss_fn), {}
