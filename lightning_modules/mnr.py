"""In-batch multiple-negatives ranking (MNR)."""
from __future__ import annotations

from typing import Any

from torch import Tensor

from encoders.sentence import SentenceEncoder
from .ranking import InBatchRanking, negative_keys


class MNR(InBatchRanking):
    """Multiple-negatives ranking loss: cross entropy over ``scale * cos(a_i, p_j)`` where every
    other positive in the batch (and every hard negative, when given) is a negative of anchor i
    (Henderson et al. 2017, "Efficient Natural Language Response Suggestion for Smart Reply";
    sentence-transformers' MultipleNegativesRankingLoss).

    Batch keys: ``anchor``, ``positive`` and optionally ``negative``, or n hard negatives ``negative_1`` ...
    ``negative_n`` (tokenized): ``NLIDataModule(view="pairs" | "triplets")``, the latter with
    ``num_negatives: n`` on a file mined by ``mine.py``; its sampler never puts the same sentence twice
    in a batch (a duplicate is a false negative). Every negative column is a candidate of every anchor:
    with global batch G and n negatives, each anchor ranks its positive among G * (1 + n) candidates.
    Defaults: scale 20 (temperature 0.05), candidates gathered from every device.

    ``matryoshka_dims`` (base class) sums this loss over truncated embeddings, each renormalised by the
    cosine (Kusupati et al. 2022; sentence-transformers' MatryoshkaLoss around this loss).

    ============================  ===========================================  =====================
    batch keys                    rows                                         candidates per anchor
    ============================  ===========================================  =====================
    anchor, positive              entailment pairs                             G
    anchor, positive, negative    premise, entailment, contradiction           2G
    anchor, positive, negative_i  a mined file (``mine.py``), i = 1..n          (1 + n) G
    ============================  ===========================================  =====================

    Example (any objective trains through ``train.py``; this is the loss on one batch)::

        model = MNR(SentenceEncoder("sentence-transformers/all-MiniLM-L6-v2"), matryoshka_dims=[384, 64])
        enc = model.encoder.tokenize
        loss, logs = model.training_loss({"anchor": enc(["A man plays a guitar.", "A dog runs."]),
                                          "positive": enc(["Someone plays an instrument.", "An animal runs."]),
                                          "negative_1": enc(["A man plays a piano.", "A dog sleeps."])})

    Related: ``SimCSE`` (supervised: the same loss at temperature 0.05 on NLI triplets), ``DCLR``.

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
        columns = [batch["anchor"], batch["positive"]] + [batch[k] for k in negative_keys(batch)]
        loss, logs = self.ranked_loss(columns, self.scale, self.symmetric)
        logs["scale"] = self.scale
        return loss, logs
