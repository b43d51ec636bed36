"""FILM's objective in reduced coordinates: per-anchor scores, the averaged hinge, and its gradient in P."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from .lowrank import DTYPE


def triplet_accuracy(emb: Any, triplets: Tensor) -> float:
    """Fraction of triplets (i, j, k) with ``e_i.e_j > e_i.e_k``. emb: (n, d)."""
    e = torch.as_tensor(np.asarray(emb) if not isinstance(emb, Tensor) else emb).to(DTYPE)
    i, j, k = triplets.long().unbind(1)
    margin = (e[i] * (e[j] - e[k])).sum(-1)  # (m,)
    return (margin > 0).double().mean().item()


# --------------------------------------------------------------------------- objective


def anchor_statistics(Zt: Tensor, triplets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-anchor ``(anchors (N,), Za (N, r), Wa (N, r))``: the anchors' reduced coordinates and
    ``w_i = 1/(|T_i|+1) sum_{T_i} (z_j - z_k)``. Zt is ``Z^T`` (n, r)."""
    anchors, slot = torch.unique(triplets[:, 0], return_inverse=True)  # (N,), (m,)
    N, n = anchors.numel(), Zt.shape[0]
    counts = torch.bincount(slot, minlength=N).to(Zt.dtype)  # (N,) |T_i|
    rows = torch.cat([slot, slot])
    cols = torch.cat([triplets[:, 1], triplets[:, 2]])
    vals = torch.cat([torch.ones(len(slot)), -torch.ones(len(slot))]).to(Zt.dtype)
    Q = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (N, n), check_invariants=True).coalesce()  # (N, n)
    Wa = torch.sparse.mm(Q, Zt) / (counts + 1)[:, None]  # (N, r)
    return anchors, Zt[anchors], Wa


def anchor_scores(ZP: Tensor, WP: Tensor, s: Tensor) -> Tensor:
    """``a_i = sum_l s_l (p_l.z_i)(p_l.w_i)``. ZP = Za P, WP = Wa P: (N, d); s: (d,) -> (N,)."""
    return (ZP * WP) @ s


def hinge_objective(ZP: Tensor, WP: Tensor, s: Tensor, margin: float, l2: float) -> tuple[Tensor, Tensor]:
    """``(f, active)``: ``f = mean_i [m - a_i]_+ + l2/2 ||s||^2`` and the mask ``m - a_i > 0`` (N,)."""
    slack = margin - anchor_scores(ZP, WP, s)  # (N,)
    return slack.clamp(min=0).mean() + 0.5 * l2 * (s @ s), slack > 0


def _coefficients(ZP: Tensor, WP: Tensor, weights: Tensor) -> Tensor:
    # c_l = 1/N sum_i alpha_i (p_l.z_i)(p_l.w_i) = p_l^T M_alpha p_l  -> (d,)
    return (ZP * WP).T @ weights.to(ZP.dtype) / ZP.shape[0]


def objective_gradient(
    Za: Tensor,
    Wa: Tensor,
    ZP: Tensor,
    WP: Tensor,
    s: Tensor,
    weights: Tensor,
    l2: float,
    smooth: float | None = None,
    fixed_s: bool = False,
) -> Tensor:
    """Euclidean gradient (r, d) in P. ``fixed_s=True``: of f(P, s) at this s
    (``-2 M_A P diag(s)``, weights = the active mask); else of ``F(P) = min_s f(P, s)`` with the
    dual weights alpha from ``solve_scales`` (Danskin), or of ``f(P, s(P))`` with the smoothed
    closed form (adds the chain-rule term). Za, Wa: (N, r); ZP, WP: (N, d); weights: (N,)."""
    act = weights.to(Za.dtype)[:, None]  # (N, 1)
    two_MP = (Za.T @ (act * WP) + Wa.T @ (act * ZP)) / Za.shape[0]  # (r, d) = 2 M_alpha P
    coef = -s
    if smooth is not None and not fixed_s:
        c = _coefficients(ZP, WP, weights)
        coef = coef + (l2 * s - c) * torch.sigmoid(c / (l2 * smooth)) / l2
    return two_MP * coef[None, :]
