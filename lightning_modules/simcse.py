"""SimCSE, unsupervised (dropout as augmentation) and supervised (NLI)."""
from __future__ import annotations

from typing import Any, Sequence

from torch import Tensor

from encoders.augment import Augmentation, check_augmentation, positive_view
from encoders.sentence import SentenceEncoder
from .ranking import InBatchRanking, negative_keys


class SimCSE(InBatchRanking):
    """Contrastive learning of sentence embeddings (Gao, Yao & Chen, EMNLP 2021).

    Unsupervised, batch key ``sentence`` (``WikiDataModule``): each sentence is encoded twice;
    the two dropout masks make the positive pair and the other sentences of the (global) batch
    are the negatives. Paper: bert-base-uncased, ``cls`` pooling with an MLP head used in
    training only (evaluated as ``cls_before_pooler``), temperature 0.05, max length 32,
    batch 64, lr 3e-5, one epoch of 1M Wikipedia sentences, STS-B dev every 125 steps.

    Supervised, batch keys ``anchor``, ``positive``, ``negative`` (``NLIDataModule(view=
    "triplets")``): entailment as positive, contradiction as hard
    negative. Paper: batch 512, lr 5e-5, 3 epochs, ``cls`` pooling with the MLP head kept. With n mined
    negatives (``negative_1`` ... ``negative_n``, ``NLIDataModule(view="triplets", num_negatives=n)``) every
    negative column is a candidate of every anchor, as in MNR.

    ``matryoshka_dims`` (base class) sums the loss over truncated embeddings (Kusupati et al. 2022).

    The encoder must be in train mode (dropout on) for the unsupervised task to be non-trivial;
    the base module makes sure of it.

    Args:
        encoder: the sentence encoder.
        temperature: tau of the cosine logits (scale = 1 / tau).
        augmentation: the unsupervised positive view: ``dropout`` (SimCSE's), or dropout plus one of
            ``token_shuffle``, ``token_cutoff``, ``span_cutoff``, ``feature_cutoff`` (encoders/augment.py).
        augmentation_rate: the fraction of tokens or hidden dimensions a cutoff zeroes.
        gather_across_devices: negatives from all devices, with gradient.
        mini_batch_size: GradCache mini-batch; None embeds the whole batch at once.
    """

    batch_keys = ("sentence",)  # unsupervised
    supervised_batch_keys = ("anchor", "positive", "negative")
    needs_unique_sentences = True

    @classmethod
    def accepts_batch_keys(cls, keys: Sequence[str]) -> bool:
        mined = {"anchor", "positive", "negative_1"} <= set(keys)  # n mined negatives
        return set(cls.batch_keys) <= set(keys) or set(cls.supervised_batch_keys) <= set(keys) or mined

    @classmethod
    def describe_batch_keys(cls) -> str:
        return (f"{', '.join(cls.batch_keys)} (unsupervised) or {', '.join(cls.supervised_batch_keys)} "
                "(supervised; or negative_1 ... negative_n)")

    def __init__(self, encoder: SentenceEncoder, temperature: float = 0.05, augmentation: Augmentation = "dropout",
                 augmentation_rate: float = 0.1, **kwargs: Any) -> None:
        super().__init__(encoder, **kwargs)
        if temperature <= 0:
            raise ValueError(f"model.init_args.temperature must be positive, got {temperature}")
        check_augmentation(augmentation, augmentation_rate)
        self.temperature = temperature
        self.augmentation = augmentation
        self.augmentation_rate = augmentation_rate

    def training_loss(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
        if "sentence" in batch:  # unsupervised: the same sentences twice, two dropout masks
            sentence = batch["sentence"]
            columns = [sentence, positive_view(sentence, self.augmentation, self.augmentation_rate, self.encoder.dim)]
        else:
            if self.augmentation != "dropout":  # the NLI triples are their own positives: nothing to augment
                raise ValueError(f"model.init_args.augmentation={self.augmentation!r} applies to unsupervised SimCSE "
                                 "(single sentences); supervised batches (anchor, positive, negative) take only "
                                 "'dropout'")
            columns = [batch["anchor"], batch["positive"]] + [batch[k] for k in negative_keys(batch)]
        loss, logs = self.ranked_loss(columns, 1.0 / self.temperature)
        logs["temperature"] = self.temperature
        return loss, logs
