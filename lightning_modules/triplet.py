"""SBERT's triplet objective."""
from __future__ import annotations

from typing import Any

from torch import Tensor

from encoders.sentence import SentenceEncoder

from .base import SentenceEmbeddingModule
from .losses import triplet_loss


class Triplet(SentenceEmbeddingModule):
    """max(||a - p|| - ||a - n|| + margin, 0) with Euclidean distance (Reimers & Gurevych 2019, eq. 3).

    Batch keys: ``anchor``, ``positive``, ``negative`` (tokenized): ``NLIDataModule(view="triplets")``
    (premise, entailment, contradiction) or any file with those three columns.
    Paper: margin 1 (sentence-transformers defaults to 5; we keep the paper's value), mean pooling.

    With ``SentenceEncoder(freeze_transformer=True, projection_dim=d)`` this is FILM's deep
    variant (Tang & Aw 2020): a shared-weight three-branch network whose only trainable part is
    a linear head over frozen transformer embeddings.

    ``matryoshka_dims`` (base class) sums the loss over truncated embeddings (Kusupati et al. 2022);
    the distance is Euclidean, so a truncation is used as it is, not renormalised.

    Args:
        encoder: the sentence encoder.
        margin: the triplet margin.
    """

    batch_keys = ("anchor", "positive", "negative")
    supports_matryoshka = True

    def __init__(self, encoder: SentenceEncoder, margin: float = 1.0, **kwargs: Any) -> None:
        super().__init__(encoder, **kwargs)
        if margin < 0:
            raise ValueError(f"model.init_args.margin must be non-negative, got {margin}")
        self.margin = margin

    def training_loss(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        logs: dict[str, Tensor] = {}

        def loss_fn(embeddings: list[Tensor]) -> Tensor:
            a, p, n = embeddings  # (B, H) each
            d_pos, d_neg = (a - p).float().norm(dim=-1), (a - n).float().norm(dim=-1)  # (B,)
            logs["satisfied"] = (d_pos + self.margin <= d_neg).float().mean()
            return triplet_loss(a, p, n, self.margin)

        loss = self.embedding_loss([batch["anchor"], batch["positive"], batch["negative"]], loss_fn)
        return loss, logs
