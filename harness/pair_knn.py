"""Pairwise kNN matching (FILM's duplicate detection): is each pair a match in the learned space, and the k
chosen on a validation split by cross-entropy."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

_DT = torch.float64


def _partner_ranks(emb_a: Any, emb_b: Any, chunk: int = 2048) -> tuple[Tensor, Tensor]:
    """Rank of b_p among a_p's neighbours and of a_p among b_p's, in the pool of all 2n rows
    (self excluded; rank 1 = nearest; ties with the partner do not push it down). -> (n,), (n,)"""
    a = torch.as_tensor(np.asarray(emb_a) if not isinstance(emb_a, Tensor) else emb_a).to(_DT)
    b = torch.as_tensor(np.asarray(emb_b) if not isinstance(emb_b, Tensor) else emb_b).to(_DT)
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(f"emb_a and emb_b must both be (n, d), got {tuple(a.shape)} and {tuple(b.shape)}")
    n = a.shape[0]
    pool = torch.cat([a, b])  # (2n, d)
    partner_sim = (a * b).sum(-1)  # (n,)
    ranks = []
    for queries in (a, b):
        out = torch.empty(n, dtype=torch.long)
        for lo in range(0, n, chunk):
            q = queries[lo: lo + chunk]  # (c, d)
            sims = q @ pool.T  # (c, 2n)
            ps = partner_sim[lo: lo + chunk]
            self_sim = (q * q).sum(-1)  # (c,)
            beat = (sims > ps[:, None]).sum(1) - (self_sim > ps).long()  # the query itself is not a neighbour
            out[lo: lo + chunk] = beat + 1
        ranks.append(out)
    return ranks[0], ranks[1]


def knn_pair_match(emb_a: Any, emb_b: Any, k: int) -> Tensor:
    """Mutual-kNN matching: pair p (rows ``emb_a[p]``, ``emb_b[p]``, similarity = dot product in
    the learned space) is a match when each sentence is among the other's k nearest neighbours
    in the pool of all 2n sentences (self excluded). Returns (n,) bool.

    Duplicated sentences in the pool occupy neighbour slots: de-duplicate the pool if needed.
    """
    rank_ab, rank_ba = _partner_ranks(emb_a, emb_b)
    return (rank_ab <= k) & (rank_ba <= k)


def knn_match_proba(emb_a: Any, emb_b: Any, k: int, alpha: float = 1.0) -> Tensor:
    """Smoothed match probability: the two directional kNN tests are votes,
    ``p = (votes + alpha) / (2 + 2 alpha)`` (Laplace); ``p > 1/2`` iff mutual kNN. -> (n,)"""
    rank_ab, rank_ba = _partner_ranks(emb_a, emb_b)
    return _vote_proba(rank_ab, rank_ba, k, alpha)


def _vote_proba(rank_ab: Tensor, rank_ba: Tensor, k: int, alpha: float) -> Tensor:
    votes = (rank_ab <= k).to(_DT) + (rank_ba <= k).to(_DT)
    return (votes + alpha) / (2 + 2 * alpha)


def select_k(
    emb_a: Any,
    emb_b: Any,
    labels: Any,
    candidates: Sequence[int] = (1, 2, 3, 5, 10, 20, 50, 100),
    alpha: float = 1.0,
) -> tuple[int, dict[int, float]]:
    """Choose k for ``knn_pair_match`` on a validation split: the candidate with the lowest
    binary cross-entropy of ``knn_match_proba`` against ``labels`` (n,) in {0, 1}; ties go to the
    smaller k. Returns ``(best_k, {k: cross_entropy})``."""
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0 (it keeps the cross-entropy finite), got {alpha}")
    if not candidates:
        raise ValueError("select_k needs at least one candidate k")
    y = torch.as_tensor(np.asarray(labels)).to(_DT).ravel()
    rank_ab, rank_ba = _partner_ranks(emb_a, emb_b)
    if y.numel() != rank_ab.numel():
        raise ValueError(f"{y.numel()} labels for {rank_ab.numel()} pairs")
    ce = {}
    for k in sorted(set(int(c) for c in candidates)):
        p = _vote_proba(rank_ab, rank_ba, k, alpha)
        ce[k] = torch.nn.functional.binary_cross_entropy(p, y).item()
    best = min(ce, key=lambda k: (ce[k], k))
    return best, ce

