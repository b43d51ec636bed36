"""Positive views other than dropout: the augmentations DCLR's paper swaps in for SimCSE's dropout view.

One switch, ``augmentation``, makes the second (positive) view of an unsupervised batch; the anchor view is
always the plain sentence. Dropout stays on in both views (the encoder is in train mode), so ``dropout`` is
the plain SimCSE/DCLR positive and each other kind adds one perturbation to it, as ConSERT (Yan et al., 2021)
defines them on the embedding layer's output:

- ``token_shuffle``: the order of the row's tokens is permuted, [CLS] and [SEP] kept in place (the same as
  permuting their position ids);
- ``token_cutoff``: a fraction ``rate`` of the row's tokens have their whole embedding vector zeroed;
- ``span_cutoff``: one contiguous span of ``rate`` of the row's tokens is zeroed;
- ``feature_cutoff``: a fraction ``rate`` of the hidden dimensions is zeroed for every token of the row.

[CLS] and [SEP] (the first and last real token of a right-padded row) are never cut or moved, and a cut
always takes at least one token or dimension. The cutoffs travel as ``features["embedding_mask"]``, a 0/1
multiplier of the embedding output, (B, L, 1) or (B, 1, H), which ``SentenceEncoder`` applies on the padded
and on the padding-free path alike.
"""
from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import Tensor

Augmentation = Literal["dropout", "token_shuffle", "token_cutoff", "span_cutoff", "feature_cutoff"]
AUGMENTATIONS: tuple[str, ...] = get_args(Augmentation)


def check_augmentation(kind: str, rate: float, key: str = "model.init_args") -> None:
    if kind not in AUGMENTATIONS:
        raise ValueError(f"{key}.augmentation must be one of {', '.join(AUGMENTATIONS)}, got {kind!r}")
    if not 0 < rate < 1:
        raise ValueError(f"{key}.augmentation_rate must be in (0, 1), got {rate}")


def interior(mask: Tensor) -> Tensor:
    """(B, L) bool: the real tokens of right-padded rows other than the first and the last ([CLS], [SEP])."""
    real = mask.bool()
    lengths = real.sum(1, keepdim=True)  # (B, 1)
    position = torch.arange(mask.shape[1], device=mask.device).expand_as(real)  # (B, L)
    return real & (position > 0) & (position < lengths - 1)


def _count(inner: Tensor, rate: float) -> Tensor:
    """(B,) how many of each row's interior tokens a cut takes: ceil(rate x n), at least 1 where n > 0."""
    n = inner.sum(1)
    return torch.minimum(torch.ceil(rate * n.float()).long().clamp(min=1), n)


def token_shuffle(input_ids: Tensor, mask: Tensor) -> Tensor:
    """(B, L) ids with each row's interior tokens in a random order."""
    inner = interior(mask)
    keys = torch.rand(input_ids.shape, device=input_ids.device)
    keys = keys.masked_fill(~inner, 2.0)  # interior tokens sort first among themselves, in random order
    order = keys.argsort(1)  # (B, L): the first n_b entries are the row's interior positions, shuffled
    slots = inner.long().cumsum(1) - 1  # (B, L): rank of each interior position among the row's interior
    source = order.gather(1, slots.clamp(min=0))  # (B, L): which interior position fills each interior slot
    return torch.where(inner, input_ids.gather(1, source), input_ids)


def token_cutoff(mask: Tensor, rate: float) -> Tensor:
    """(B, L, 1) 0/1: ``rate`` of each row's interior tokens zeroed, chosen at random."""
    inner = interior(mask)
    keys = torch.rand(mask.shape, device=mask.device).masked_fill(~inner, 2.0)
    rank = keys.argsort(1).argsort(1)  # (B, L): each position's rank; interior positions rank first
    cut = inner & (rank < _count(inner, rate)[:, None])
    return (~cut).unsqueeze(-1).float()


def span_cutoff(mask: Tensor, rate: float) -> Tensor:
    """(B, L, 1) 0/1: one contiguous span of ``rate`` of each row's interior tokens zeroed."""
    inner = interior(mask)
    n = inner.sum(1)  # (B,)
    span = _count(inner, rate)  # (B,)
    # start at interior position 1 + U{0, ..., n - span}
    start = 1 + (torch.rand(n.shape, device=mask.device) * (n - span + 1).float()).long()
    position = torch.arange(mask.shape[1], device=mask.device)[None, :]  # (1, L)
    cut = inner & (position >= start[:, None]) & (position < (start + span)[:, None])
    return (~cut).unsqueeze(-1).float()


def feature_cutoff(batch: int, hidden: int, rate: float, device: torch.device) -> Tensor:
    """(B, 1, H) 0/1: ``ceil(rate x H)`` of the hidden dimensions zeroed per row, for all its tokens."""
    keys = torch.rand((batch, hidden), device=device)
    cut = keys.argsort(1).argsort(1) < max(1, math.ceil(rate * hidden))
    return (~cut).unsqueeze(1).float()


def positive_view(features: dict[str, Tensor], kind: str, rate: float, hidden: int) -> dict[str, Tensor]:
    """The positive view of a tokenized batch: ``features`` itself for ``dropout``, else a copy with shuffled
    ``input_ids`` or an ``embedding_mask``."""
    if kind == "dropout":
        return features
    ids, mask = features["input_ids"], features["attention_mask"]
    if kind == "token_shuffle":
        return {**features, "input_ids": token_shuffle(ids, mask)}
    if kind == "token_cutoff":
        cut = token_cutoff(mask, rate)
    elif kind == "span_cutoff":
        cut = span_cutoff(mask, rate)
    elif kind == "feature_cutoff":
        cut = feature_cutoff(ids.shape[0], hidden, rate, ids.device)
    else:
        raise ValueError(f"unknown augmentation {kind!r}; one of {', '.join(AUGMENTATIONS)}")
    return {**features, "embedding_mask": cut}
