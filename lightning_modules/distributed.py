"""Cross-device gathering of embeddings for in-batch negatives under DDP.

Each device embeds its own ``per_device_batch_size`` examples; gathering every column makes the
contrastive denominator span the global batch. The gather must keep the gradient: without it the
keys from other devices are constants and each device learns from only its own slice of them.

Gather each column (anchors, positives, hard negatives) separately and concatenate afterwards::

    keys = torch.cat([gather_with_grad(positives), gather_with_grad(hard_negatives)])
    labels = rank * B + torch.arange(B)

so the gathered hard negatives keep the order of the gathered positives. Gathering a
concatenation ``cat[positives, hard_negatives]`` instead interleaves the columns device by device
and shifts every positive's index (a real sentence-transformers bug). Every device must hold the
same batch size (all_gather needs equal shapes); drop the last incomplete batch.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _AllGatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sums each slice's gradient over ranks and keeps its own.

    Rank r's loss L_r depends on every rank's slice, so the gradient for this rank's slice is
    ``sum_r dL_r / dslice``; DDP then averages parameter gradients over ranks, which gives the
    gradient of ``mean_r L_r``, the same as one device holding the global batch.

    Written here rather than using ``torch.distributed.nn.functional.all_gather``: that one is
    deprecated in torch 2.13 and, off NCCL, emulates its backward with all-to-all. all_reduce
    works on every backend (gloo included); it moves world_size times more data than a
    reduce-scatter, negligible for (B, H) embeddings.
    """

    @staticmethod
    def forward(ctx, t: Tensor) -> Tensor:
        rank, world = rank_and_world()
        ctx.rank, ctx.batch = rank, t.shape[0]
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t)
        return torch.cat(parts, dim=0)  # (world * B, ...)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous().clone()  # all_reduce is in place; never touch autograd's buffer
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        start = ctx.rank * ctx.batch
        return grad[start : start + ctx.batch]  # (B, ...)


def gather_with_grad(t: Tensor) -> Tensor:
    """Concatenate ``t`` over ranks along dim 0, in rank order, keeping the gradient.

    Rank r's rows sit at ``r * B : (r + 1) * B``. Gradients from every rank's loss flow back to
    each rank's own slice. Returns ``t`` itself when torch.distributed is not initialised or
    the world size is 1. Shapes must be equal on every rank, and every rank must backpropagate
    through the gather (its backward is a collective too).

    t: (B, ...) -> (world * B, ...)
    """
    _, world = rank_and_world()
    if world == 1:
        return t
    return _AllGatherWithGrad.apply(t)


def sum_over_ranks(t: Tensor) -> Tensor:
    """``t`` summed over ranks (a new tensor; no gradient), ``t`` itself when not distributed. A collective:
    every rank must call it."""
    _, world = rank_and_world()
    if world == 1:
        return t
    total = t.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total
