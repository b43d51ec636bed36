"""In-batch multiple-negatives ranking (MNR)."""
from __future__ import annotations

from typing import Any

from torch import Tensor

from encoders.sentence import SentenceEncoder
from .ranking import InBatchRanking


class MNR(InBatchRanking):
    """Multiple-negatives ranking loss: cross entropy over ``scale * cos(a_i, p_j)`` where every
    other positive in the batch (and every hard negative, when given) is a negative of anchor i
    (Henderson et al. 2017, "Efficient Natural Language Response Suggestion for Smart Reply";
    sentence-transformers' MultipleNegativesRankingLoss).

    Batch keys: ``anchor``, ``positive`` and optionally ``negative`` (tokenized):
    ``NLIDataModule(view="pairs" | "triplets")``, whose sampler never
    puts the same sentence twice in a batch (a duplicate is a false negative).
    Defaults: scale 20 (temperature 0.05), candidates gathered from every device.

    The batch is the method: more candidates, harder task. Cross-device gathering makes the
    global batch the candidate set; gradient accumulation does not add candidates.

    Args:
        encoder: the sentence encoder.
        scale: inverse temperature of the cosine logits.
        symmetric: add the positive -> anchor ranking term (averaged with the forward term).
        gather_across_devices: candidates from all devices, with gradient (needs equal
            per-device batches; the DataModule's sampler guarantees it).
        mini_batch_size: GradCache mini-batch; None embeds the whole batch at once.
    """

    batch_keys = ("anchor", "positive")  # and "negative" when the data has hard negatives
    needs_unique_sentences = True

    def __init__(self, encoder: SentenceEncoder, scale: float = 20.0, symmetric: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(encoder, **kwargs)
        if scale <= 0:
            raise ValueError(f"model.init_args.scale must be positive, got {scale}")
        self.scale = scale
        self.symmetric = symmetric

    def training_loss(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        columns = [batch["anchor"], batch["positive"]] + ([batch["negative"]] if "negative" in batch else [])
        loss, logs = self.ranked_loss(columns, self.scale, self.symmetric)
        logs["scale"] = self.scale
        return loss, logs
