"""In-batch ranking across devices: the plumbing MNR and SimCSE share (the maths is in losses.py)."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from encoders.sentence import SentenceEncoder

from .base import SentenceEmbeddingModule
from .distributed import gather_with_grad, rank_and_world
from .grad_cache import grad_cache_loss
from .losses import alignment, in_batch_accuracy, info_nce_loss, uniformity


def in_batch_candidates(
    anchors: Tensor, positives: Tensor, negatives: Tensor | None, gather: bool,
) -> tuple[Tensor, Tensor]:
    """Every anchor's candidates in the (global) batch and the column of its own positive.

    Candidates are the positives of all anchors, then the hard negatives of all anchors. With
    ``gather`` each column is gathered from every device separately, with gradient, before
    concatenation, so the hard negatives stay aligned with their anchors and the local anchor
    i's positive sits at ``rank * B + i``.

    anchors, positives, negatives: (B, H) -> candidates (world*B [+ world*B], H), labels (B,)
    """
    rank, world = rank_and_world() if gather else (0, 1)
    collect = gather_with_grad if gather else (lambda t: t)
    keys = [collect(positives)] + ([collect(negatives)] if negatives is not None else [])
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
    negatives: Tensor | None,
    scale: float,
    gather: bool,
    symmetric: bool = False,
) -> tuple[Tensor, Tensor]:
    """Cross entropy of each anchor over every candidate in the (global) batch (``in_batch_candidates``);
    ``symmetric`` adds the positive -> anchor direction.

    anchors, positives, negatives: (B, H) -> (loss, in-batch top-1 accuracy)
    """
    keys, labels = in_batch_candidates(anchors, positives, negatives, gather)  # (C, H), (B,)
    loss, logits = info_nce_loss(anchors, keys, labels, scale)  # logits (B, C)
    if symmetric:
        back, _ = info_nce_loss(positives, gather_with_grad(anchors) if gather else anchors, labels, scale)
        loss = (loss + back) / 2
    return loss, in_batch_accuracy(logits, labels)


def split_features(features: dict[str, Tensor], size: int) -> list[dict[str, Tensor]]:
    """Cut a padded (B, L) batch into mini-batches of ``size`` rows, each trimmed of padding columns."""
    chunks = []
    for start in range(0, features["input_ids"].shape[0], size):
        chunk = {k: v[start:start + size] for k, v in features.items()}
        width = int(chunk["attention_mask"].sum(1).max())
        chunks.append({k: v[:, :width] for k, v in chunk.items()})
    return chunks


def embed_columns(
    embed: Callable[[dict[str, Tensor]], Tensor],
    columns: list[dict[str, Tensor]],
    loss_fn: Callable[[list[Tensor]], Tensor],
    mini_batch_size: int | None,
) -> Tensor:
    """``loss_fn`` over the embeddings of each column, directly or through GradCache.

    With ``mini_batch_size`` the batch is embedded in mini-batches without graph, the loss and
    its gradient with respect to the embeddings are computed once, and each mini-batch is
    re-embedded with graph under the same dropout state in the backward pass: the gradients of
    the full batch with the memory of one mini-batch (Gao et al. 2021, GradCache).
    """
    if mini_batch_size is None:
        return loss_fn([embed(c) for c in columns])
    return grad_cache_loss(embed, [split_features(c, mini_batch_size) for c in columns], loss_fn)


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
    loss over columns of tokenized sentences (anchors, positives[, hard negatives]).

    Args:
        encoder: the sentence encoder.
        gather_across_devices: candidates from all devices, with gradient (needs equal
            per-device batches; the DataModule's sampler guarantees it).
        mini_batch_size: GradCache mini-batch; None embeds the whole batch at once.
    """

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
        """Embed the columns (GradCache when ``mini_batch_size``), rank, and the diagnostics."""
        logs: dict[str, Tensor] = {}

        def loss_fn(embeddings: list[Tensor]) -> Tensor:
            anchors, positives = embeddings[0], embeddings[1]  # (B, H) each
            negatives = embeddings[2] if len(embeddings) > 2 else None
            loss, accuracy = ranking_loss(anchors, positives, negatives, scale, self.gather_across_devices, symmetric)
            logs.update(ranking_diagnostics(anchors, positives, accuracy))
            return loss

        return embed_columns(self.encoder, columns, loss_fn, self.mini_batch_size), logs
