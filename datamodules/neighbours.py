"""Batches that hold near neighbours: where in-batch false negatives exist (DCLR's weighting has work there).

Random batches of Wikipedia sentences seldom hold two sentences of the same meaning, so an in-batch negative is
almost never a false one. ``neighbour_groups`` groups each sentence with its nearest neighbours under a model's
embeddings; a data module with ``neighbour_batches`` set deals those groups whole into its batches
(``SentenceBatchSampler(groups=...)``), shuffled every epoch, so any objective trains on batches of several such
groups.
"""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F


def nearest(embeddings: torch.Tensor, k: int, chunk: int = 4096) -> torch.Tensor:
    """(N, k) the ``k`` nearest other rows of each row by cosine, nearest first (chunked: never N x N at once)."""
    unit = F.normalize(embeddings.float(), dim=-1)  # (N, H)
    k = min(k, len(unit) - 1)
    out = []
    for start in range(0, len(unit), chunk):
        sims = unit[start:start + chunk] @ unit.T  # (c, N)
        rows = torch.arange(start, min(start + chunk, len(unit)))
        sims[torch.arange(len(rows)), rows] = -2.0  # never its own neighbour
        out.append(sims.topk(k, dim=-1).indices)
    return torch.cat(out) if out else torch.empty(0, k, dtype=torch.long)


def neighbour_groups(embeddings: torch.Tensor, size: int, seed: int, candidates: int = 64) -> list[list[int]]:
    """Rows in groups of ``size``: in a random order, each row not yet grouped starts a group with its nearest
    neighbours not yet grouped (of its ``candidates`` nearest). Rows whose neighbours were all taken end in groups
    of their own kind at the end (leftovers, grouped in order). Every row is in exactly one group."""
    if size < 1:
        raise ValueError(f"neighbour group size must be positive, got {size}")
    near = nearest(embeddings, candidates).tolist()
    order = list(range(len(near)))
    random.Random(seed).shuffle(order)
    taken = [False] * len(near)
    groups, leftovers = [], []
    for row in order:
        if taken[row]:
            continue
        group = [row]
        taken[row] = True
        for other in near[row]:
            if len(group) == size:
                break
            if not taken[other]:
                group.append(other)
                taken[other] = True
        (groups if len(group) == size else leftovers).append(group)
    rest = [r for g in leftovers for r in g]
    groups += [rest[i:i + size] for i in range(0, len(rest), size)]
    return groups
