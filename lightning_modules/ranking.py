"""In-batch ranking across devices: the plumbing MNR and SimCSE share (the maths is in losses.py)."""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from encoders.sentence import SentenceEncoder

from .base import SentenceEmbeddingModule
from .distributed import gather_with_grad, rank_and_world
from .losses import alignment, in_batch_accuracy, info_nce_loss, uniformity


def negative_keys(batch: dict[str, Any]) -> list[str]:
    """The batch's hard-negative columns in order: ``negative`` (one per anchor), or ``negative_1`` ...
    ``negative_n`` (a mined file, ``NLIDataModule(num_negatives=n)``), or none."""
    if "negative" in batch:
        return ["negative"]
    numbered = [k for k in batch if k.startswith("negative_") and k[len("negative_"):].isdigit()]
    return sorted(numbered, key=lambda k: int(k[len("negative_"):]))


def in_batch_candidates(
    anchors: Tensor, positives: Tensor, negatives: Tensor | Sequence[Tensor] | None, gather: bool,
) -> tuple[Tensor, Tensor]:
    """Every anchor's candidates in the (global) batch and the column of its own positive.

    Candidates are the positives of all anchors, then the first hard negatives of all anchors, then
    the second ones, and so on: every negative column is a candidate of every anchor. With ``gather``
    each column is gathered from every device separately, with gradient, before concatenation, so the
    hard negatives stay aligned with their anchors and the local anchor i's positive sits at
    ``rank * B + i``.

    anchors, positives: (B, H); negatives: (B, H), a list of n such, or None
    -> candidates ((1 + n) * world*B, H), labels (B,)
    """
    rank, world = rank_and_world() if gather else (0, 1)
    collect = gather_with_grad if gather else (lambda t: t)
    if negatives is None:
        negatives = []
    elif isinstance(negatives, Tensor):
        negatives = [negatives]
    keys = [collect(positives)] + [collect(n) for n in negatives]  # each (world*B, H)
    labels = rank * anchors.shape[0] + torch.arange(anchors.shape[0], device=anchors.device)  # (B,)
    return torch.cat(keys), labels


def ranking_diagnostics(anchors: Tensor, positives: Tensor, accuracy: Tensor) -> dict[str, Tensor]:
    """What every in-batch objective logs: top-1 accuracy, and the alignment of the positive pairs and
    uniformity of the anchors (Wang & Isola 2020), on detached embeddings."""
    return {"accuracy": accuracy, "alignment": alignment(anchors.detach(), positives.detach()),
            "uniformity": uniformity(anchors.detach())}


def ranking_loss(
    anchors: Tensor,
    positives: Tensor,
    negatives: Tensor | Sequence[Tensor] | None,
    scale: float,
    gather: bool,
    symmetric: bool = False,
) -> tuple[Tensor, Tensor]:
    """Cross entropy of each anchor over every candidate in the (global) batch (``in_batch_candidates``);
    ``symmetric`` adds the positive -> anchor direction.

    anchors, positives: (B, H); negatives: (B, H), a list of n such, or None -> (loss, in-batch top-1 accuracy)
    """
    keys, labels = in_batch_candidates(anchors, positives, negatives, gather)  # (C, H), (B,)
    loss, logits = info_nce_loss(anchors, keys, labels, scale)  # logits (B, C)
    if symmetric:
        back, _ = info_nce_loss(positives, gather_with_grad(anchors) if gather else anchors, labels, scale)
        loss = (loss + back) / 2
    return loss, in_batch_accuracy(logits, labels)


def check_grad_cache_strategy(trainer: Any, mini_batch_size: int | None) -> None:
    """GradCache re-embeds inside backward; under DDP that needs ``static_graph=True``, or the
    reducer synchronises wrong gradients without any error."""
    if mini_batch_size is None or trainer.world_size == 1:
        return
    kwargs = getattr(trainer.strategy, "_ddp_kwargs", {})  # DDPStrategy has no public accessor for its DDP kwargs
    if not kwargs.get("static_graph", False):
        raise ValueError(
            "model.init_args.mini_batch_size (GradCache) under DDP needs "
            "--trainer.strategy lightning.pytorch.strategies.DDPStrategy --trainer.strategy.static_graph true"
        )


class InBatchRanking(SentenceEmbeddingModule):
    """Base of the in-batch ranking objectives (MNR, SimCSE): the settings they share and the
    loss over columns of tokenized sentences (anchors, positives[, hard negatives 1..n]).

    Args:
        encoder: the sentence encoder.
        gather_across_devices: candidates from all devices, with gradient (needs equal
            per-device batches; the DataModule's sampler guarantees it).
        mini_batch_size: GradCache mini-batch; None embeds the whole batch at once.
    """

    supports_matryoshka = True

    def __init__(self, encoder: SentenceEncoder, gather_across_devices: bool = True,
                 mini_batch_size: int | None = None, **kwargs: Any) -> None:
        super().__init__(encoder, **kwargs)
        if mini_batch_size is not None and mini_batch_size < 1:
            raise ValueError(f"model.init_args.mini_batch_size must be positive, got {mini_batch_size}")
        self.gather_across_devices = gather_across_devices
        self.mini_batch_size = mini_batch_size

    def on_fit_start(self) -> None:
        check_grad_cache_strategy(self.trainer, self.mini_batch_size)

    def ranked_loss(self, columns: list[dict[str, Tensor]], scale: float,
                    symmetric: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        """Embed the columns (GradCache when ``mini_batch_size``; the Matryoshka sum when set), rank, and the
        diagnostics. Columns: anchors, positives, then any number of hard-negative columns."""
        logs: dict[str, Tensor] = {}

        def loss_fn(embeddings: list[Tensor]) -> Tensor:
            anchors, positives, negatives = embeddings[0], embeddings[1], embeddings[2:]  # (B, H) each
            loss, accuracy = ranking_loss(anchors, positives, negatives, scale, self.gather_across_devices, symmetric)
            logs.update(ranking_diagnostics(anchors, positives, accuracy))
            return loss

        return self.embedding_loss(columns, loss_fn, self.mini_batch_size), logs
