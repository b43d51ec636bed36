"""SBERT's NLI classification objective."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from encoders.sentence import SentenceEncoder

from .base import SentenceEmbeddingModule
from .losses import PAIR_FEATURES, PairFeature, sbert_pair_features

class NLISoftmax(SentenceEmbeddingModule):
    """Softmax classifier over ``[u; v; |u - v|]`` with cross-entropy (Reimers & Gurevych, EMNLP 2019).

    Batch keys: ``sentence1``, ``sentence2`` (tokenized), ``label`` (0 entailment, 1 neutral,
    2 contradiction): ``NLIDataModule(view="labelled")``.
    Paper defaults: bert-base-uncased, mean pooling, batch 16, Adam lr 2e-5, 10% linear warmup,
    one epoch over SNLI + MultiNLI, classifier input ``[u; v; |u - v|]``.

    The classifier is a registered submodule, so the optimizer trains it; it is not part of the
    encoder and is not exported with it.

    Args:
        encoder: the sentence encoder.
        num_labels: classes of the classifier.
        features: the classifier input, concatenated in this order: any of ``u``, ``v``,
            ``abs_diff`` (|u - v|), ``prod`` (u * v), each at most once (the paper's Table 6 ablation).
    """

    batch_keys = ("sentence1", "sentence2", "label")

    def __init__(
        self,
        encoder: SentenceEncoder,
        num_labels: int = 3,
        features: list[PairFeature] = ["u", "v", "abs_diff"],  # noqa: B006 (never mutated; the CLI shows it)
        **kwargs: Any,
    ) -> None:
        features = list(features)
        if not features or len(set(features)) != len(features) or not set(features) <= set(PAIR_FEATURES):
            raise ValueError(f"features must be distinct names among {', '.join(PAIR_FEATURES)}, got {features}")
        super().__init__(encoder, **kwargs)
        self.features = features
        self.classifier = nn.Linear(len(features) * encoder.dim, num_labels)

    def training_loss(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        u = self.encoder(batch["sentence1"])  # (B, H)
        v = self.encoder(batch["sentence2"])  # (B, H)
        with torch.autocast(u.device.type, enabled=False):
            logits = self.classifier(sbert_pair_features(u.float(), v.float(), self.features))  # (B, num_labels)
            loss = F.cross_entropy(logits, batch["label"])
        accuracy = (logits.argmax(-1) == batch["label"]).float().mean()
        return loss, {"accuracy": accuracy}
