r"""FILM: fast low-rank metric learning on the Stiefel manifold, as pure maths (no Lightning).

Tang & Aw (2020), "Fast and Interpretable Low-rank Metric Learning", arXiv:2010.05523.
The optimiser is the Cayley-transform / Barzilai-Borwein / non-monotone line search method of
Wen & Yin (2013), "A feasible method for optimization with orthogonality constraints".

Conventions
-----------
``X`` is ``(D, n)``: **one column per sentence** (TF-IDF or frozen sentence embeddings), dense
(numpy / torch) or scipy-sparse. Columns are L2-normalised here (idempotent; all-zero columns,
e.g. a sentence made only of stop words, stay zero). All maths is torch float64.
Triplets are an int64 ``(m, 3)`` tensor of column indices ``(i, j, k)``: sentence i is more
similar to j than to k.

Objective
---------
With ``y = L x`` (``L`` is ``d x D``), ``T_i`` the triplets of anchor i and N the number of
distinct anchors::

    f(L) = 1/N sum_i [ m - 1/(|T_i|+1) sum_{(i,j,k) in T_i} (y_i.y_j - y_i.y_k) ]_+  +  lambda/2 ||s||^2

i.e. the hinge is averaged over anchors (sentences that anchor no triplet would only add the
constant m and are left out). The ``+1`` damps anchors with few triplets.

Low-rank reformulation (derived here; the paper's notation differs)
-------------------------------------------------------------------
Truncated SVD ``X ~ U S V^T`` (rank r; ``U: D x r``, ``S: r x r``, ``V: n x r``). Parametrise ::

    L = diag(sqrt(s)) P^T R U^T,    P in St(r, d) = {P in R^{r x d} : P^T P = I_d},  s in R^d, s >= 0
    R = sqrt(n) S^{-1}   (whiten=True, default)      or      R = I   (whiten=False)

For a training column ``x_i = U S V^T e_i`` this gives ``y_i = diag(sqrt(s)) P^T z_i`` with
reduced coordinates ``Z = R S V^T`` (``r x n``; column ``z_i``): ``Z = sqrt(n) V^T`` when
whitening, ``Z = S V^T = U^T X`` otherwise. The ``sqrt(n)`` is a deliberate change from the
bare ``S^{-1}``: with ``Z = V^T`` every entry is O(1/sqrt(n)), all ``y_i.y_j`` are tiny compared
with the margin and every anchor sits in the hinge forever; with ``sqrt(n)`` each reduced
coordinate has unit mean square over the training sentences, so ``margin`` and ``l2`` mean the
same thing whatever n. Then ::

    y_i.y_j = z_i^T K z_j,   K = P diag(s) P^T   (the metric in reduced coordinates, ||K||_F = ||s||)

Let ``w_i = 1/(|T_i|+1) sum_{(i,j,k) in T_i} (z_j - z_k)``. Anchor i's score and the objective::

    a_i(P, s) = z_i^T P diag(s) P^T w_i = sum_l s_l (p_l^T z_i)(p_l^T w_i)
    f(P, s)   = 1/N sum_i [m - a_i(P, s)]_+  +  lambda/2 ||s||^2

On a region where the active set ``A = {i : m - a_i > 0}`` is fixed, f is smooth::

    f = m|A|/N - sum_l s_l c_l(P) + lambda/2 ||s||^2,
    c_l(P) = p_l^T M_A p_l,      M_A = 1/(2N) sum_{i in A} (z_i w_i^T + w_i z_i^T)   (r x r, symmetric)

* **Closed-form s** for fixed P and A: ``s_l = max(c_l / lambda, 0)``; with ``smooth=beta``,
  ``s_l = beta * softplus(c_l / (lambda * beta))`` (-> the max as beta -> 0).
  Plugging it back: ``F_A(P) = m|A|/N - 1/(2 lambda) sum_l max(c_l, 0)^2``.
* **Euclidean gradient** in P (``r x d``) at fixed s: ``df/dP = -2 M_A P diag(s)``. With s at its
  optimum this is also the gradient of ``F(P) = min_{s>=0} f(P, s)`` (Danskin). With smoothing
  the chain rule through s adds a term:
  ``dF/dP = 2 M_A P diag(-s + (lambda s - c) * sigmoid(c / (lambda beta)) / lambda)``.
  ``M_A`` is never formed: ``M_A P = 1/(2N) (Z_A^T (W_A P) + W_A^T (Z_A P))``, O(N r d).
* **The hinge makes it piecewise.** The active set depends on s and s on the active set, so for
  a given P, ``solve_scales`` takes the active set at the current point, sets s to its closed
  form (halving the move if f went up: it is a descent direction of the convex f(P, .)),
  recomputes the active set, and repeats; when the set reproduces itself s is the exact
  minimiser. Generically, though, the minimiser puts a few (<= d) anchors exactly on the margin
  and the sets cycle; a Newton solve of the Huber-smoothed problem then identifies those
  anchors and the KKT system is solved exactly with them tight and fractional weights.
  In dual terms: ``min_s f = max_{alpha in [0,1]^N} m/N sum_i alpha_i
  - 1/(2 lambda) ||max(c_alpha, 0)||^2`` with ``c_alpha`` the coefficients weighted by
  alpha, ``s = max(c_alpha / lambda, 0)``; the closed form above is alpha = the 0/1 active set
  (a Frank-Wolfe vertex of the dual), and anchors on the margin get alpha in (0, 1). The
  gradient uses these alpha (``M_alpha``), which makes it exact at kinks too (tested against
  finite differences). If that fails to verify, s is the best iterate, never worse than the start.
  ``F(P)`` reported and line-searched is the true hinge objective at that s; the active set is
  recomputed at every trial point and so after each accepted step. With smoothing only the
  plain fixed point runs.

Optimiser (Wen & Yin 2013)
--------------------------
``G = dF/dP``, ``W = G P^T - P G^T`` (skew, r x r), canonical Riemannian gradient ``W P = G - P G^T P``.
Curve ``Y(tau) = (I + tau/2 W)^{-1} (I - tau/2 W) P`` stays on St(r, d) and ``F'(Y(0)) = -||W||_F^2 / 2``.
When ``2d < r`` we use the Sherman-Morrison-Woodbury form with ``U = [G, P]``, ``V = [P, -G]``
(``W = U V^T``): ``Y(tau) = P - tau U (I + tau/2 V^T U)^{-1} V^T P``, a 2d x 2d solve.
Step sizes alternate BB1 ``<S,S>/|<S,Y>|`` and BB2 ``|<S,Y>|/<Y,Y>`` (``S = P_{k+1} - P_k``,
``Y`` the change of ``W P``), clipped to [1e-10, 1e10]; the first step is ``1/||W||_F``.
Non-monotone Armijo test of Zhang & Hager: accept when ``F(Y(tau)) <= C_k - rho tau ||W||^2/2``,
else ``tau *= delta``; then ``Q_{k+1} = eta Q_k + 1``, ``C_{k+1} = (eta Q_k C_k + F_{k+1}) / Q_{k+1}``
(rho=1e-4, eta=0.85, delta=0.2).

Initial P: ``init="spectral"`` (default) takes the top-d eigenvectors of M with every anchor
active, the exact optimum as long as no anchor leaves the hinge; ``"random"`` is a seeded
Gaussian projected by geoopt. From random starts a column with ``c_l <= 0`` gets ``s_l = 0`` and a
zero gradient column, so that dimension often stays unused (a stationary plateau of F).

**M-FILM** (``minibatch=b``): each step samples b anchors (with all their triplets; epochs of a
seeded permutation), solves s on that batch, and takes one Cayley step of normalised, decaying
size ``tau_t = minibatch_step / (sqrt(1 + t) ||W_t||_F)`` (no line search: a batch loss is a
noisy line-search target). ``finalize`` re-solves s on all anchors.

What geoopt does and what is written here
-----------------------------------------
geoopt's ``Stiefel(canonical=True)`` (``CanonicalStiefel``) supplies: the polar projection of the
random initial P (``projx``), the canonical Riemannian gradient ``G - P G^T P`` (``egrad2rgrad``),
the dense Cayley retraction (``retr(P, -tau G)`` is exactly ``Y(tau)`` above, an r x r solve) and
``check_point_on_manifold``. Written here: the objective and its gradient, the inner s solver,
the SMW form of the Cayley curve, the BB step, the non-monotone line search and the M-FILM loop.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Sequence

import geoopt
import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

__all__ = [
    "FILM",
    "FILMState",
    "tfidf_features",
    "groups_from_pairs",
    "triplets_from_groups",
    "triplets_from_scored_pairs",
    "triplets_from_nli",
    "explicit_triplets",
    "triplet_accuracy",
    "anchor_statistics",
    "anchor_scores",
    "hinge_objective",
    "closed_form_scales",
    "solve_scales",
    "objective_gradient",
    "cayley_dense",
    "cayley_smw",
    "knn_pair_match",
    "knn_match_proba",
    "select_k",
]

_DT = torch.float64
_NO_TRIPLETS = "no triplets could be generated from the data"


# --------------------------------------------------------------------------- features


def tfidf_features(sentences: Sequence[str], **vectorizer_kwargs: Any) -> tuple[sp.csc_matrix, Any]:
    """TF-IDF features of ``sentences`` as a ``(D, n)`` scipy CSC matrix (one column per sentence,
    L2-normalised by scikit-learn's default ``norm="l2"``), and the fitted ``TfidfVectorizer``.

    Raises ValueError for fewer than two sentences or an empty vocabulary (e.g. only stop words).
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    sentences = list(sentences)
    if len(sentences) < 2:
        raise ValueError(
            f"TF-IDF needs at least two sentences, got {len(sentences)}: a single-sentence "
            "vocabulary gives every term the same idf and no metric can be learned"
        )
    vectorizer = TfidfVectorizer(**vectorizer_kwargs)
    try:
        features = vectorizer.fit_transform(sentences)  # (n, D)
    except ValueError as err:
        if "empty vocabulary" in str(err):
            raise ValueError(
                "empty vocabulary: the sentences contain no token the vectorizer keeps "
                f"(only stop words, or too strict min_df/max_df?): {err}"
            ) from err
        raise
    return sp.csc_matrix(features.T, dtype=np.float64), vectorizer  # (D, n)


def _check_finite(X: Any) -> None:
    data = X.data if sp.issparse(X) else X
    finite = torch.isfinite(data).all() if isinstance(data, Tensor) else np.isfinite(np.asarray(data)).all()
    if not finite:
        raise ValueError("features contain NaN or inf; clean or impute them before FILM")


def _prepare_features(X: Any, normalize: bool) -> Tensor | sp.csc_matrix:
    """(D, n) float64 torch tensor or scipy CSC matrix, finite, columns L2-normalised."""
    if isinstance(X, Tensor) and X.is_sparse:
        X = X.to_dense()
    _check_finite(X)
    if sp.issparse(X):
        X = sp.csc_matrix(X, dtype=np.float64)
        if X.ndim != 2 or min(X.shape) == 0:
            raise ValueError(f"features must be a non-empty (D, n) matrix, got shape {X.shape}")
        if normalize:
            norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=0)).ravel())  # (n,)
            X = X @ sp.diags(1.0 / np.where(norms > 0, norms, 1.0))
            X = sp.csc_matrix(X)
        return X
    X = torch.as_tensor(np.asarray(X) if not isinstance(X, Tensor) else X).to(_DT)
    if X.dim() != 2 or min(X.shape) == 0:
        raise ValueError(f"features must be a non-empty (D, n) matrix, got shape {tuple(X.shape)}")
    if normalize:
        norms = torch.linalg.vector_norm(X, dim=0)  # (n,)
        X = X / torch.where(norms > 0, norms, torch.ones_like(norms))
    return X


def _truncated_svd(X: Tensor | sp.csc_matrix, rank: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """Top-``rank`` U (D, r), S (r,), V (n, r), singular values descending."""
    D, n = X.shape
    if sp.issparse(X):
        small = min(D, n) <= 2000 or rank >= min(D, n) - 1
        if small and D * n <= 50_000_000:
            X = torch.from_numpy(X.toarray())
        else:
            from scipy.sparse.linalg import svds

            v0 = np.random.default_rng(seed).standard_normal(min(D, n))
            u, s_vals, vt = svds(X, k=rank, v0=v0)
            order = np.argsort(-s_vals)
            return (torch.from_numpy(u[:, order].copy()), torch.from_numpy(s_vals[order].copy()),
                    torch.from_numpy(vt[order].T.copy()))
    u, s_vals, vh = torch.linalg.svd(X, full_matrices=False)
    return u[:, :rank], s_vals[:rank], vh[:rank].T


# --------------------------------------------------------------------------- triplets


def groups_from_pairs(n: int, pairs: Any) -> Tensor:
    """Group id of each of ``n`` sentences: connected components of the "same meaning" graph
    whose edges are ``pairs`` ((p, 2) indices). Union-find with path halving and union by size;
    ids are 0.. in order of each group's first sentence. Returns (n,) int64."""
    pairs = torch.as_tensor(np.asarray(pairs) if not isinstance(pairs, Tensor) else pairs).long().reshape(-1, 2)
    if pairs.numel() and (pairs.min() < 0 or pairs.max() >= n):
        raise ValueError(f"pair indices must lie in [0, {n}), got range [{pairs.min()}, {pairs.max()}]")
    parent = list(range(n))
    size = [1] * n

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in pairs.tolist():
        ra, rb = find(a), find(b)
        if ra == rb:
            continue
        if size[ra] < size[rb]:
            ra, rb = rb, ra
        parent[rb] = ra
        size[ra] += size[rb]
    roots = [find(a) for a in range(n)]
    relabel: dict[int, int] = {}
    return torch.tensor([relabel.setdefault(r, len(relabel)) for r in roots], dtype=torch.long)


def triplets_from_groups(group_ids: Any, n_per_anchor: int = 5, seed: int = 0) -> Tensor:
    """Triplets (i, j, k) with j in i's group (j != i) and k in another group.

    Each sentence whose group has another member anchors ``n_per_anchor`` triplets, positives
    and negatives drawn uniformly with replacement (seeded). Returns (m, 3) int64.
    """
    g = np.asarray(group_ids.cpu() if isinstance(group_ids, Tensor) else group_ids).astype(np.int64).ravel()
    n = g.size
    rng = np.random.default_rng(seed)
    order = np.argsort(g, kind="stable")  # sentences sorted by group
    sorted_g = g[order]
    starts = np.searchsorted(sorted_g, g, side="left")  # (n,) first slot of i's group
    ends = np.searchsorted(sorted_g, g, side="right")
    group_size = ends - starts
    anchors = np.flatnonzero((group_size >= 2) & (group_size < n))
    if anchors.size == 0 or n_per_anchor < 1:
        raise ValueError(
            f"{_NO_TRIPLETS}: every group is a singleton or all {n} sentences share one group"
        )
    i = np.repeat(anchors, n_per_anchor)  # (m,)
    st, gs = starts[i], group_size[i]
    # positive: a uniformly random other member of i's group (skip i's own slot)
    own_slot = np.empty(n, dtype=np.int64)
    own_slot[order] = np.arange(n)
    off = rng.integers(0, gs - 1)
    pos_slot = st + off
    pos_slot = pos_slot + (pos_slot >= own_slot[i])
    j = order[pos_slot]
    # negative: a uniformly random slot outside [start, end)
    off = rng.integers(0, n - gs)
    neg_slot = np.where(off < st, off, off + gs)
    k = order[neg_slot]
    return torch.from_numpy(np.stack([i, j, k], axis=1)).long()


def triplets_from_scored_pairs(
    pairs: Any,
    scores: Any,
    threshold: float,
    n: int,
    n_per_anchor: int = 5,
    seed: int = 0,
) -> Tensor:
    """Triplets from STS-like scored pairs: a pair scored ``>= threshold`` is a positive (both
    directions). Negatives of anchor i are its partners scored below the threshold when it has
    any, else sentences drawn uniformly among the ``n`` that are neither i nor its positives
    (random negatives; almost always dissimilar in STS data). Returns (m, 3) int64.
    """
    pairs = np.asarray(pairs.cpu() if isinstance(pairs, Tensor) else pairs, dtype=np.int64).reshape(-1, 2)
    scores = np.asarray(scores.cpu() if isinstance(scores, Tensor) else scores, dtype=np.float64).ravel()
    if len(pairs) != len(scores):
        raise ValueError(f"{len(pairs)} pairs but {len(scores)} scores")
    rng = np.random.default_rng(seed)
    pos: dict[int, set[int]] = {}
    neg: dict[int, set[int]] = {}
    for (a, b), sc in zip(pairs.tolist(), scores.tolist()):
        if a == b:
            continue
        book = pos if sc >= threshold else neg
        book.setdefault(a, set()).add(b)
        book.setdefault(b, set()).add(a)
    rows = []
    for i in sorted(pos):
        positives = sorted(pos[i])
        negatives = sorted(neg.get(i, set()) - pos[i])
        for _ in range(n_per_anchor):
            j = positives[rng.integers(len(positives))]
            if negatives:
                k = negatives[rng.integers(len(negatives))]
            else:
                if len(positives) + 1 >= n:
                    break
                k = int(rng.integers(n))
                while k == i or k in pos[i]:
                    k = int(rng.integers(n))
            rows.append((i, j, k))
    if not rows:
        raise ValueError(f"{_NO_TRIPLETS}: no pair is scored >= threshold={threshold}")
    return torch.tensor(rows, dtype=torch.long)


def triplets_from_nli(premise: Any, hypothesis: Any, labels: Sequence[str]) -> Tensor:
    """NLI triplets (premise, entailed hypothesis, contradicted hypothesis): every combination
    of an entailment and a contradiction of the same premise id (SimCSE-style hard negatives).
    ``premise``/``hypothesis`` are sentence ids (p,), ``labels`` their NLI labels."""
    premise = np.asarray(premise, dtype=np.int64).ravel()
    hypothesis = np.asarray(hypothesis, dtype=np.int64).ravel()
    ent: dict[int, list[int]] = {}
    con: dict[int, list[int]] = {}
    for p, h, lab in zip(premise.tolist(), hypothesis.tolist(), labels):
        if lab == "entailment":
            ent.setdefault(p, []).append(h)
        elif lab == "contradiction":
            con.setdefault(p, []).append(h)
    rows = [(p, j, k) for p in ent if p in con for j in ent[p] for k in con[p] if j != k]
    if not rows:
        raise ValueError(f"{_NO_TRIPLETS}: no premise has both an entailment and a contradiction")
    return torch.tensor(rows, dtype=torch.long)


def explicit_triplets(anchors: Any, positives: Any, negatives: Any, n: int | None = None) -> Tensor:
    """Stack explicit (anchor, positive, negative) index triples into (m, 3) int64, checked."""
    t = torch.stack([torch.as_tensor(np.asarray(a)).long().ravel() for a in (anchors, positives, negatives)], 1)
    return _check_triplets(t, n)


def _check_triplets(triplets: Any, n: int | None) -> Tensor:
    t = torch.as_tensor(triplets.cpu() if isinstance(triplets, Tensor) else np.asarray(triplets))
    if t.numel() == 0:
        raise ValueError(f"{_NO_TRIPLETS}: the triplet tensor is empty")
    if t.dim() != 2 or t.shape[1] != 3 or t.is_floating_point():
        raise ValueError(f"triplets must be an integer (m, 3) tensor, got {tuple(t.shape)} {t.dtype}")
    t = t.long()
    if t.min() < 0 or (n is not None and t.max() >= n):
        raise ValueError(f"triplet indices must lie in [0, {n}), got range [{t.min()}, {t.max()}]")
    return t


def triplet_accuracy(emb: Any, triplets: Tensor) -> float:
    """Fraction of triplets (i, j, k) with ``e_i.e_j > e_i.e_k``. emb: (n, d)."""
    e = torch.as_tensor(np.asarray(emb) if not isinstance(emb, Tensor) else emb).to(_DT)
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


def closed_form_scales(ZP: Tensor, WP: Tensor, weights: Tensor, l2: float, smooth: float | None = None) -> Tensor:
    """Minimiser over s >= 0 of ``-sum_l s_l c_l + l2/2 ||s||^2`` for the active set ``weights``
    (bool mask, or dual weights alpha in [0, 1]): ``max(c / l2, 0)``, or
    ``smooth * softplus(c / (l2 * smooth))`` when smoothing. -> (d,)"""
    c = _coefficients(ZP, WP, weights)
    if smooth is None:
        return (c / l2).clamp(min=0)
    return smooth * torch.nn.functional.softplus(c / (l2 * smooth))


def solve_scales(
    ZP: Tensor,
    WP: Tensor,
    margin: float,
    l2: float,
    smooth: float | None = None,
    s0: Tensor | None = None,
    max_iter: int = 5,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(s, alpha, f)``: minimise the true hinge objective f over s >= 0 for fixed P.

    Active-set fixed point (module docstring), warm-started at ``s0`` (default 0: every anchor
    active): set s to the closed form of the current active set, halving the move (at most 10
    times) until f does not increase, recompute the active set; stop when it reproduces itself
    (then s is the exact minimiser). When the minimiser puts anchors exactly on the margin the
    sets cycle instead; ``_polish_on_margin`` then identifies those anchors (Newton on a
    Huber-smoothed hinge), solves the KKT system with them tight and keeps the result only if
    it verifies (exact again), else s is an improvement on ``s0``, never worse. ``alpha`` (N,)
    are the dual weights: 1 active, 0 inactive, in [0, 1] for anchors on the margin;
    ``s = max(c_alpha / l2, 0)`` and ``dF/dP`` uses them.
    Smoothed s skips the halving and the polish (it does not minimise f exactly anyway).
    """
    s = torch.zeros(ZP.shape[1], dtype=ZP.dtype, device=ZP.device) if s0 is None else s0.clone()
    f, active = hinge_objective(ZP, WP, s, margin, l2)
    exact = False
    for _ in range(max_iter):
        s_new = closed_form_scales(ZP, WP, active, l2, smooth)
        f_new, active_new = hinge_objective(ZP, WP, s_new, margin, l2)
        t = 1.0
        if smooth is None:
            step = s_new - s
            while f_new > f and t > 1e-3:
                t *= 0.5
                s_new = s + t * step
                f_new, active_new = hinge_objective(ZP, WP, s_new, margin, l2)
            if f_new > f:
                break
        exact = t == 1.0 and torch.equal(active_new, active)
        s, f, active = s_new, f_new, active_new
        if exact:
            break
    alpha = active.to(ZP.dtype)
    if smooth is None and not exact:
        polished = _polish_on_margin(ZP * WP, margin, l2, s)
        if polished is not None:
            s_p, alpha_p = polished
            f_p, _ = hinge_objective(ZP, WP, s_p, margin, l2)
            if f_p <= f + 1e-12 * abs(f):  # a verified KKT point is the minimum: only rounding differs
                s, alpha, f = s_p, alpha_p, f_p
    return s, alpha, f


def _polish_on_margin(g: Tensor, margin: float, l2: float, s: Tensor) -> tuple[Tensor, Tensor] | None:
    """Exact minimiser of ``phi(s) = 1/N sum_i [m - g_i.s]_+ + l2/2 ||s||^2`` over s >= 0 when
    anchors sit exactly on the margin (g_i = (ZP * WP)_i). Returns ``(s, alpha)`` or None.

    1. Identify: projected (semismooth) Newton on the Huber-smoothed hinge, the kink widened to
       ``0 < m - g_i.s < mu``, warm-started at s, for mu = 1e-2, 1e-4, ... 1e-10 times the
       margin, with an exact line search. Its quadratic zone is the candidate set E of anchors
       on the margin (their dual weights are (m - g_i.s) / mu).
    2. Solve the KKT system exactly (``_kkt_with_margin_set``); return the first mu whose
       candidate verifies.
    """
    d = g.shape[1]
    scale = max(abs(margin), 1e-12)
    eye = torch.eye(d, dtype=g.dtype, device=g.device)
    for mu in (1e-2 * scale, 1e-4 * scale, 1e-6 * scale, 1e-8 * scale, 1e-10 * scale):
        zones = None
        for _ in range(30):
            t = margin - g @ s  # (N,)
            quad = (t > 0) & (t < mu)
            grad = l2 * s - g.T @ _huber_slope(t, mu) / g.shape[0]  # (d,)
            free = (s > 0) | (grad < 0)
            new_zones = torch.cat([quad, t >= mu, free])
            if zones is not None and torch.equal(zones, new_zones):
                break  # the last Newton step was exact for this piece
            zones = new_zones
            n_free = int(free.sum())
            gq = g[quad][:, free]
            H = l2 * eye[:n_free, :n_free] + gq.T @ gq / (g.shape[0] * mu)
            step = torch.zeros_like(s)
            step[free] = -torch.linalg.solve(H, grad[free])
            u = _exact_line_search(s, step, t, g @ step, mu, l2)
            if u * float(torch.linalg.vector_norm(step)) <= 1e-15 * (1.0 + float(torch.linalg.vector_norm(s))):
                break
            zones = zones if u == 1.0 else None  # a shortened step: the piece may still change
            s = (s + u * step).clamp(min=0)
        t = margin - g @ s
        exact = _kkt_with_margin_set(g, margin, l2, s > 0, (t > 0) & (t < mu), t > 0)
        if exact is not None:
            return exact
    return None


def _huber_slope(t: Tensor, mu: float) -> Tensor:
    # derivative of the Huber-smoothed hinge h_mu(t): 0 (t <= 0), t / mu, 1 (t >= mu); in [0, 1]
    return (t / mu).clamp(0, 1)


def _exact_line_search(s: Tensor, step: Tensor, t: Tensor, q: Tensor, mu: float, l2: float) -> float:
    """argmin over feasible u in [0, 1] of ``l2/2 ||s + u step||^2 + mean h_mu(t - u q)``. Its
    derivative is monotone and piecewise linear in u: safeguarded Newton on it, O(N) per probe."""
    neg = step < 0
    u_hi = min(float((-s[neg] / step[neg]).min()), 1.0) if bool(neg.any()) else 1.0
    a, b, N = float(s @ step), float(step @ step), len(t)

    def slope_and_curvature(u: float) -> tuple[float, float]:
        r = t - u * q  # (N,)
        inside = (r > 0) & (r < mu)
        return (l2 * (a + u * b) - float(q @ _huber_slope(r, mu)) / N,
                l2 * b + float((q[inside] ** 2).sum()) / (N * mu))

    lo, hi = 0.0, u_hi
    u = u_hi
    for _ in range(60):
        slope, curvature = slope_and_curvature(u)
        if slope <= 0 and u == u_hi:
            return u_hi
        if abs(slope) <= 1e-15 * max(1.0, abs(a) * l2):
            return u
        lo, hi = (u, hi) if slope < 0 else (lo, u)
        u_new = u - slope / curvature
        u = u_new if lo < u_new < hi else 0.5 * (lo + hi)
        if hi - lo <= 1e-15 * max(1.0, hi):
            break
    return lo


def _kkt_with_margin_set(
    g: Tensor, margin: float, l2: float, free: Tensor, E: Tensor, positive: Tensor
) -> tuple[Tensor, Tensor] | None:
    """KKT point with the anchors E on the margin, A = positive & ~E strictly active and the
    coordinates ``free`` of s positive: ``l2 s_F = c_F``, ``c = 1/N (sum_A g_i + sum_E alpha_i
    g_i)``, ``g_{i,F}.s_F = m`` on E (an |E| x |E| solve for alpha_E). ``(s, alpha)`` if alpha_E
    lies in [0, 1] and every other KKT condition holds, else None."""
    N = g.shape[0]
    if int(E.sum()) > int(free.sum()):
        return None
    A = positive & ~E
    gE = g[E][:, free]  # (|E|, |F|)
    cA = g[A].sum(0) / N  # (d,)
    rhs = margin - gE @ cA[free] / l2  # (|E|,)
    alpha_E = torch.linalg.lstsq(gE @ gE.T / (l2 * N), rhs[:, None]).solution[:, 0] if len(rhs) else rhs
    if not bool(((alpha_E >= -1e-9) & (alpha_E <= 1 + 1e-9)).all()):
        return None
    alpha = A.to(g.dtype)
    alpha[E] = alpha_E.clamp(0, 1)
    c = g.T @ alpha / N  # (d,)
    s = torch.where(free, c / l2, torch.zeros_like(c))
    slack = margin - g @ s
    tol = 1e-9 * max(abs(margin), 1e-12)
    ok = (
        bool((s[free] > 0).all())
        and bool((c[~free] <= tol).all())
        and bool((slack[A] > -tol).all())
        and bool((slack[~A & ~E] < tol).all())
        and bool((slack[E].abs() < 1e3 * tol).all())
    )
    return (s, alpha) if ok else None


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


# --------------------------------------------------------------------------- Cayley curve

_STIEFEL = geoopt.Stiefel(canonical=True)


def cayley_dense(P: Tensor, G: Tensor, tau: float) -> Tensor:
    """``(I + tau/2 W)^{-1} (I - tau/2 W) P``, ``W = G P^T - P G^T``: geoopt's canonical-Stiefel
    retraction ``retr(P, -tau G)`` (an r x r solve)."""
    return _STIEFEL.retr(P, -tau * G)


def cayley_smw(P: Tensor, G: Tensor, tau: float) -> Tensor:
    """The same curve by Sherman-Morrison-Woodbury: ``P - tau U (I + tau/2 V^T U)^{-1} V^T P``
    with ``U = [G, P]``, ``V = [P, -G]`` (a 2d x 2d solve; cheaper when 2d < r)."""
    d = P.shape[1]
    U = torch.cat([G, P], dim=1)  # (r, 2d)
    V = torch.cat([P, -G], dim=1)  # (r, 2d)
    lhs = torch.eye(2 * d, dtype=P.dtype, device=P.device) + 0.5 * tau * (V.T @ U)  # (2d, 2d)
    return P - tau * U @ torch.linalg.solve(lhs, V.T @ P)


def _orthogonality_error(P: Tensor) -> float:
    eye = torch.eye(P.shape[1], dtype=P.dtype, device=P.device)
    return torch.linalg.matrix_norm(P.T @ P - eye).item()


# --------------------------------------------------------------------------- solver


class _Eval(NamedTuple):
    loss: float
    s: Tensor
    alpha: Tensor
    ZP: Tensor
    WP: Tensor


@dataclass
class FILMState:
    """Everything one FILM run needs between steps (what a LightningModule keeps)."""

    Za: Tensor  # (N, r) reduced coordinates of the anchors
    Wa: Tensor  # (N, r) w_i of the anchors
    U: Tensor  # (D, r) left singular vectors
    R: Tensor  # (r,) diagonal of R: sqrt(n)/S (whiten) or ones
    P: Tensor  # (r, d) on St(r, d)
    s: Tensor  # (d,) scales
    alpha: Tensor  # (N,) dual weights of the anchors at (P, s): 1 active, 0 not, (0, 1) on the margin
    loss: float  # F(P) (full data); M-FILM: last batch loss
    G: Tensor  # (r, d) Euclidean gradient at P
    rgrad: Tensor  # (r, d) canonical Riemannian gradient W P
    C: float  # Zhang-Hager reference value
    Q: float
    tau: float  # next trial step size
    grad_norm0: float
    iteration: int = 0
    converged: bool = False
    t0: float = field(default_factory=time.perf_counter)
    history: list[dict[str, float]] = field(default_factory=list)
    rng: torch.Generator | None = None
    perm: Tensor | None = None
    perm_pos: int = 0


class FILM:
    """FILM low-rank metric learning (Tang & Aw 2020) with the Wen-Yin Cayley/BB solver.

    See the module docstring for the objective, the P/s reformulation and the optimiser.
    Use ``fit(X, triplets)``/``transform(X)``, or drive it step by step
    (``state = init_state(X, triplets)``; ``info = step(state)`` until ``state.converged``;
    ``finalize(state)``), as a manual-optimisation LightningModule does.

    Attributes after fit: ``L_`` (d, D), ``P_`` (r, d), ``s_`` (d,), ``history_`` (one dict per
    step: loss, active_set_size (anchors with alpha > 0), step_size (the accepted tau),
    orthogonality_error ||P^T P - I||_F, time [s since init_state], grad_norm ||W P||_F,
    backtracks, iteration, and rel_change for full batch; M-FILM's loss is the batch loss).
    """

    def __init__(
        self,
        dim: int = 64,
        rank: int | None = None,
        margin: float = 1.0,
        l2: float = 1.0,
        max_iter: int = 200,
        tol: float = 1e-6,
        minibatch: int | None = None,
        minibatch_step: float = 0.5,
        smooth: float | None = None,
        whiten: bool = True,
        normalize: bool = True,
        init: Literal["random", "spectral"] = "spectral",
        rho: float = 1e-4,
        eta: float = 0.85,
        delta: float = 0.2,
        inner_iter: int = 5,
        seed: int = 0,
    ):
        """
        Args:
            dim: d, dimension of the learned space.
            rank: r of the truncated SVD; None = min(D, n, max(8 * dim, 256)).
            margin: hinge margin m.
            l2: lambda of the penalty lambda/2 ||s||^2.
            max_iter: steps of ``fit``.
            tol: stop when ||W P|| <= tol * max(1, ||W_0 P_0||) or the mean relative loss change
                over the last 5 steps is <= tol (full batch only).
            minibatch: anchors per M-FILM step; None = full-batch FILM.
            minibatch_step: M-FILM's initial normalised step (tau_t ||W_t|| = this / sqrt(1+t)).
            smooth: softplus temperature beta for s (None: the exact max(c/lambda, 0)).
            whiten: R = sqrt(n) S^-1 (True) or I (False) in L = diag(sqrt(s)) P^T R U^T.
            normalize: L2-normalise feature columns (idempotent for normalised input).
            init: "spectral": the top-d eigenvectors of M with every anchor active (the exact
                optimum while no anchor leaves the hinge); "random": seeded Gaussian,
                polar-projected. Random starts often strand a column l with c_l <= 0: then
                s_l = 0, its gradient column is zero and the dimension stays unused.
            rho, eta, delta: Zhang-Hager Armijo constant, averaging weight, backtracking factor.
            inner_iter: cap on the active-set iterations of the s solver.
            seed: seeds P's init, M-FILM's anchor order and the sparse SVD start vector.
        """
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if not l2 > 0:
            raise ValueError(f"l2 must be > 0 (the closed form for s divides by it), got {l2}")
        if smooth is not None and not smooth > 0:
            raise ValueError(f"smooth must be None or > 0, got {smooth}")
        if minibatch is not None and minibatch < 1:
            raise ValueError(f"minibatch must be None or >= 1, got {minibatch}")
        self.dim, self.rank, self.margin, self.l2 = dim, rank, margin, l2
        self.max_iter, self.tol, self.minibatch, self.minibatch_step = max_iter, tol, minibatch, minibatch_step
        self.smooth, self.whiten, self.normalize, self.init = smooth, whiten, normalize, init
        self.rho, self.eta, self.delta, self.inner_iter, self.seed = rho, eta, delta, inner_iter, seed

    # ------------------------------------------------------------------ set-up

    def init_state(self, X: Any, triplets: Any, P0: Tensor | None = None) -> FILMState:
        """SVD, per-anchor statistics, initial P (``P0`` if given, projected to St(r, d)) and s."""
        X = _prepare_features(X, self.normalize)
        D, n = X.shape
        triplets = _check_triplets(triplets, n)
        full_rank = min(D, n)
        r = self.rank if self.rank is not None else min(full_rank, max(8 * self.dim, 256))
        if self.dim > r:
            raise ValueError(f"dim d={self.dim} is larger than the rank r={r}; need d <= r")
        if r > full_rank:
            raise ValueError(f"rank r={r} exceeds min(D, n)={full_rank} of the {D} x {n} features")
        U, S, V = _truncated_svd(X, r, self.seed)
        keep = S > S[0] * max(D, n) * torch.finfo(_DT).eps
        if int(keep.sum()) < self.dim:
            raise ValueError(
                f"dim d={self.dim} is larger than the numerical rank r={int(keep.sum())} of the "
                "features; need d <= r (fewer dimensions, or more diverse sentences)"
            )
        U, S, V = U[:, keep], S[keep], V[:, keep]
        r = S.numel()
        R = math.sqrt(n) / S if self.whiten else torch.ones_like(S)  # (r,)
        Zt = V * (R * S)[None, :]  # (n, r) = Z^T
        _, Za, Wa = anchor_statistics(Zt, triplets)

        if P0 is None:
            P0 = self._initial_P(Za, Wa, r)
        P = _STIEFEL.projx(torch.as_tensor(P0, dtype=_DT))
        if P.shape != (r, self.dim):
            raise ValueError(f"P0 must be ({r}, {self.dim}), got {tuple(P.shape)}")
        ev = self._evaluate(Za, Wa, P, None)
        if not (ev.s > 0).any() and self.smooth is None:
            warnings.warn("every scale is zero at the initial P: the gradient vanishes there; "
                          "try init='spectral' or smooth=...", stacklevel=2)
        G = objective_gradient(Za, Wa, ev.ZP, ev.WP, ev.s, ev.alpha, self.l2, self.smooth)
        rgrad = _STIEFEL.egrad2rgrad(P, G)
        w_norm = math.sqrt(max(self._w_norm_sq(P, G), 0.0))
        rng = torch.Generator().manual_seed(self.seed)
        return FILMState(
            Za=Za, Wa=Wa, U=U, R=R, P=P, s=ev.s, alpha=ev.alpha, loss=ev.loss, G=G, rgrad=rgrad,
            C=ev.loss, Q=1.0, tau=1.0 / w_norm if w_norm > 0 else 1.0,
            grad_norm0=torch.linalg.matrix_norm(rgrad).item(), rng=rng,
        )

    def _initial_P(self, Za: Tensor, Wa: Tensor, r: int) -> Tensor:
        if self.init == "spectral":
            M = (Za.T @ Wa + Wa.T @ Za) / (2 * Za.shape[0])  # (r, r) M with every anchor active
            return torch.linalg.eigh(M).eigenvectors[:, -self.dim:].flip(1)
        if self.init != "random":
            raise ValueError(f"init must be 'random' or 'spectral', got {self.init!r}")
        gen = torch.Generator().manual_seed(self.seed)
        return torch.randn(r, self.dim, generator=gen, dtype=_DT)

    def _evaluate(self, Za: Tensor, Wa: Tensor, P: Tensor, s0: Tensor | None) -> _Eval:
        ZP, WP = Za @ P, Wa @ P  # (N, d)
        s, alpha, f = solve_scales(ZP, WP, self.margin, self.l2, self.smooth, s0, self.inner_iter)
        return _Eval(f.item(), s, alpha, ZP, WP)

    @staticmethod
    def _w_norm_sq(P: Tensor, G: Tensor) -> float:
        # ||G P^T - P G^T||_F^2 = 2 (||G||^2 - tr((P^T G)^2)) when P^T P = I
        B = P.T @ G  # (d, d)
        return 2.0 * ((G * G).sum() - (B * B.T).sum()).item()

    def cayley(self, P: Tensor, G: Tensor, tau: float) -> Tensor:
        """Point ``Y(tau)`` of the Cayley curve: SMW form when 2d < r, else geoopt's dense one."""
        return cayley_smw(P, G, tau) if 2 * P.shape[1] < P.shape[0] else cayley_dense(P, G, tau)

    def objective(self, state: FILMState, P: Tensor | None = None) -> float:
        """Full-data F(P) (s solved exactly for that P); default the state's P."""
        return self._evaluate(state.Za, state.Wa, state.P if P is None else P, state.s).loss

    # ------------------------------------------------------------------ steps

    def step(self, state: FILMState) -> dict[str, float]:
        """One optimiser step (full batch: BB + non-monotone search; else one M-FILM step).
        Updates ``state`` in place and returns (and records) the step's log dict."""
        info = self._minibatch_step(state) if self.minibatch else self._full_step(state)
        state.iteration += 1
        info.update(iteration=state.iteration, time=time.perf_counter() - state.t0,
                    orthogonality_error=_orthogonality_error(state.P))
        state.history.append(info)
        return info

    def _full_step(self, state: FILMState) -> dict[str, float]:
        P, G = state.P, state.G
        w_sq = self._w_norm_sq(P, G)
        grad_norm = torch.linalg.matrix_norm(state.rgrad).item()
        if grad_norm <= self.tol * max(1.0, state.grad_norm0) or w_sq <= 0:
            state.converged = True
            return dict(loss=state.loss, active_set_size=int((state.alpha > 0).sum()), step_size=0.0,
                        grad_norm=grad_norm, backtracks=0)
        tau, backtracks = state.tau, 0
        while True:
            Y = self.cayley(P, G, tau)
            ev = self._evaluate(state.Za, state.Wa, Y, state.s)
            if ev.loss <= state.C - self.rho * tau * 0.5 * w_sq or backtracks >= 40:
                break
            tau *= self.delta
            backtracks += 1
        G_new = objective_gradient(state.Za, state.Wa, ev.ZP, ev.WP, ev.s, ev.alpha, self.l2, self.smooth)
        rgrad_new = _STIEFEL.egrad2rgrad(Y, G_new)
        # Barzilai-Borwein step for the next iteration, alternating BB1 / BB2
        S_k, Y_k = Y - P, rgrad_new - state.rgrad
        sy = (S_k * Y_k).sum().abs().item()
        if sy > 0:
            bb = (S_k * S_k).sum().item() / sy if state.iteration % 2 == 0 else sy / (Y_k * Y_k).sum().item()
        else:
            bb = tau
        q_new = self.eta * state.Q + 1.0
        state.C = (self.eta * state.Q * state.C + ev.loss) / q_new
        state.Q = q_new
        rel_change = abs(state.loss - ev.loss) / max(1.0, abs(state.loss))
        state.P, state.G, state.rgrad, state.s, state.alpha = Y, G_new, rgrad_new, ev.s, ev.alpha
        state.loss, state.tau = ev.loss, min(max(bb, 1e-10), 1e10)
        recent = [h.get("rel_change", 0.0) for h in state.history[-4:]] + [rel_change]
        if len(recent) == 5 and sum(recent) / 5 <= self.tol:
            state.converged = True
        return dict(loss=ev.loss, active_set_size=int((ev.alpha > 0).sum()), step_size=tau,
                    grad_norm=torch.linalg.matrix_norm(rgrad_new).item(), backtracks=backtracks,
                    rel_change=rel_change)

    def _next_batch(self, state: FILMState) -> Tensor:
        N, b = state.Za.shape[0], min(self.minibatch, state.Za.shape[0])
        if state.perm is None or state.perm_pos + b > N:
            state.perm, state.perm_pos = torch.randperm(N, generator=state.rng), 0
        idx = state.perm[state.perm_pos: state.perm_pos + b]
        state.perm_pos += b
        return idx

    def _minibatch_step(self, state: FILMState) -> dict[str, float]:
        idx = self._next_batch(state)
        Zb, Wb = state.Za[idx], state.Wa[idx]  # (b, r)
        ev = self._evaluate(Zb, Wb, state.P, state.s)
        G = objective_gradient(Zb, Wb, ev.ZP, ev.WP, ev.s, ev.alpha, self.l2, self.smooth)
        w_norm = math.sqrt(max(self._w_norm_sq(state.P, G), 0.0))
        grad_norm = torch.linalg.matrix_norm(_STIEFEL.egrad2rgrad(state.P, G)).item()
        tau = self.minibatch_step / (math.sqrt(1.0 + state.iteration) * w_norm) if w_norm > 0 else 0.0
        if tau > 0:
            state.P = self.cayley(state.P, G, tau)
        state.s, state.alpha, state.loss, state.G = ev.s, ev.alpha, ev.loss, G
        return dict(loss=ev.loss, active_set_size=int((ev.alpha > 0).sum()), step_size=tau,
                    grad_norm=grad_norm, backtracks=0)

    def finalize(self, state: FILMState) -> "FILM":
        """Set ``P_``, ``s_``, ``L_``, ``history_`` from the state (M-FILM: s re-solved on all anchors)."""
        if self.minibatch:
            ev = self._evaluate(state.Za, state.Wa, state.P, state.s)
            state.s, state.alpha, state.loss = ev.s, ev.alpha, ev.loss
        ok, reason = _STIEFEL.check_point_on_manifold(state.P, explain=True, atol=1e-6, rtol=1e-6)
        if not ok:
            warnings.warn(f"P drifted off the Stiefel manifold: {reason}", stacklevel=2)
        self.P_, self.s_ = state.P.clone(), state.s.clone()
        # L = diag(sqrt(s)) P^T R U^T   (d, D)
        self.L_ = (state.s.sqrt()[:, None] * state.P.T * state.R[None, :]) @ state.U.T
        self.history_ = state.history
        self.loss_ = state.loss
        return self

    def fit(self, X: Any, triplets: Any, P0: Tensor | None = None) -> "FILM":
        """Run at most ``max_iter`` steps (full batch stops early on convergence)."""
        state = self.init_state(X, triplets, P0)
        for _ in range(self.max_iter):
            self.step(state)
            if state.converged:
                break
        return self.finalize(state)

    def transform(self, X: Any) -> Tensor | np.ndarray:
        """Embed the columns of X (D, n) -> (n, d): a tensor for tensor input, else numpy."""
        if not hasattr(self, "L_"):
            raise RuntimeError("FILM.transform called before fit/finalize")
        as_tensor = isinstance(X, Tensor)
        X = _prepare_features(X, self.normalize)
        if X.shape[0] != self.L_.shape[1]:
            raise ValueError(f"features have D={X.shape[0]} rows, the fitted L expects {self.L_.shape[1]}")
        if sp.issparse(X):
            Y = torch.from_numpy(np.asarray(X.T @ self.L_.T.numpy()))  # (n, d)
        else:
            Y = X.T @ self.L_.T  # (n, d)
        return Y if as_tensor else Y.numpy()


# --------------------------------------------------------------------------- pair matching


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
