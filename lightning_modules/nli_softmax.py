"""SBERT's NLI classification objective."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import SentenceEmbeddingModule
from encoders.sentence import SentenceEncoder
from .losses import sbert_pair_features


class NLISoftmax(SentenceEmbeddingModule):
    """Softmax classifier over ``[u; v; |u - v|]`` with cross-entropy (Reimers & Gurevych, EMNLP 2019).

    Batch keys: ``sentence1``, ``sentence2`` (tokenized), ``label`` (0 entailment, 1 neutral,
    2 contradiction): ``NLIDataModule(view="labelled")``.
    Paper defaults: bert-base-uncased, mean pooling, batch 16, Adam lr 2e-5, 10% linear warmup,
    one epoch over SNLI + MultiNLI.

    The classifier is a registered submodule, so the optimizer trains it; it is not part of the
    encoder and is not exported with it.

    Args:
        encoder: the sentence encoder.
        num_labels: classes of the classifier.
    """

    batch_keys = ("sentence1", "sentence2", "label")

    def __init__(self, encoder: SentenceEncoder, num_labels: int = 3, **kwargs: Any) -> None:
        super().__init__(encoder, **kwargs)
        self.classifier = nn.Linear(3 * encoder.dim, num_labels)

    def training_loss(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        u = self.encoder(batch["sentence1"])  # (B, H)
        v = self.encoder(batch["sentence2"])  # (B, H)
        with torch.autocast(u.device.type, enabled=False):
            logits = self.classifier(sbert_pair_features(u.float(), v.float()))  # (B, num_labels)
            loss = F.cross_entropy(logits, batch["label"])
        accuracy = (logits.argmax(-1) == batch["label"]).float().mean()
        return loss, {"accuracy": accuracy}
