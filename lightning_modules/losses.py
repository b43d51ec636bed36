"""The maths of every objective, as pure functions of embedding tensors.

Nothing here knows about batches, tokenizers or Lightning: each function takes
embeddings (and labels or scores) and returns a loss. Similarities and losses are
computed in fp32 whatever the autocast precision, because softmax over
temperature-scaled cosines and ``log(1 - softmax)`` lose too much in 16-bit.
"""
from __future__ import annotations

import math
from typing import Callable, Literal, Sequence, get_args

import torch
import torch.nn.functional as F
from torch import Tensor


PairFeature = Literal["u", "v", "abs_diff", "prod"]
PAIR_FEATURES: tuple[str, ...] = get_args(PairFeature)


def sbert_pair_features(u: Tensor, v: Tensor, features: Sequence[str] = ("u", "v", "abs_diff")) -> Tensor:
    """SBERT's classifier input: the concatenation, in the order given, of ``u``, ``v``, ``abs_diff``
    (``|u - v|``) and ``prod`` (``u * v``). The default is the paper's ``[u; v; |u - v|]``
    (Reimers & Gurevych 2019, eq. 1); its Table 6 ablates the others.

    u, v: (B, H) -> (B, len(features) * H)
    """
    parts = {"u": lambda: u, "v": lambda: v, "abs_diff": lambda: (u - v).abs(), "prod": lambda: u * v}
    return torch.cat([parts[f]() for f in features], dim=-1)


def cosine_mse_loss(u: Tensor, v: Tensor, target: Tensor) -> Tensor:
    """SBERT's regression objective: MSE between cos(u, v) and a target in [0, 1].

    u, v: (B, H); target: (B,)
    """
    cos = F.cosine_similarity(u.float(), v.float(), dim=-1)  # (B,)
    return F.mse_loss(cos, target.float())


def _fp32(x: Tensor) -> Tensor:
    # At least fp32: bf16/fp16 are upcast, float64 (used by tests) is kept.
    return x if x.dtype == torch.float64 else x.float()


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


# --------------------------------------------------------------------------- SBERT triplet


def triplet_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0) -> Tensor:
    """SBERT's triplet objective (Reimers & Gurevych 2019, sec. 3), Euclidean distance.

    ``mean_i max(||a_i - p_i||_2 - ||a_i - n_i||_2 + margin, 0)``; margin 1 is the paper's value.
    anchor, positive, negative: (B, H)
    """
    a, p, n = _fp32(anchor), _fp32(positive), _fp32(negative)
    d_pos = torch.linalg.vector_norm(a - p, dim=-1)  # (B,)
    d_neg = torch.linalg.vector_norm(a - n, dim=-1)  # (B,)
    return F.relu(d_pos - d_neg + margin).mean()


# --------------------------------------------------------------------------- InfoNCE family


def cosine_similarity_matrix(a: Tensor, b: Tensor) -> Tensor:
    """All pairwise cosines in (at least) fp32. a: (N, H), b: (M, H) -> (N, M)."""
    a = F.normalize(_fp32(a), dim=-1)
    b = F.normalize(_fp32(b), dim=-1)
    return a @ b.T  # (N, M)


def info_nce_loss(queries: Tensor, keys: Tensor, labels: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Cross entropy over ``scale * cos(q_i, k_j)``; returns ``(loss, logits)``.

    One function for the in-batch contrastive objectives:

    - MNR (Henderson et al. 2017; sentence-transformers' MultipleNegativesRankingLoss):
      scale 20, keys = cat[positives, hard negatives].
    - Unsupervised SimCSE (Gao et al. 2021): scale = 1 / temperature, temperature 0.05,
      keys = the second dropout view of the same sentences.
    - Supervised SimCSE: keys = cat[entailments, contradictions], same temperature.

    ``labels[i]`` is the column of query i's positive among the keys, so the positive may sit
    anywhere: under DDP the local anchor i's positive is at ``rank * B + i`` among gathered keys.

    queries: (B, H); keys: (C, H); labels: (B,) long; logits: (B, C)
    """
    _check_positive("scale", scale)
    logits = scale * cosine_similarity_matrix(queries, keys)  # (B, C)
    return F.cross_entropy(logits, labels), logits


def in_batch_accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    """Fraction of queries whose positive has the largest logit. logits: (B, C); labels: (B,)."""
    return (logits.argmax(dim=-1) == labels).float().mean()


# --------------------------------------------------------------------------- Matryoshka


def matryoshka_loss(
    loss_fn: Callable[[list[Tensor]], Tensor],
    embeddings: Sequence[Tensor],
    dims: Sequence[int],
    weights: Sequence[float] | None = None,
) -> tuple[Tensor, dict[int, Tensor]]:
    """Matryoshka representation learning (Kusupati et al., NeurIPS 2022; sentence-transformers'
    MatryoshkaLoss): ``sum_d w_d * loss_fn([e[..., :d] for e in embeddings])``, so that the first d
    dimensions of an embedding are an embedding on their own. Returns the sum and each dimension's
    unweighted loss (detached).

    Truncation only slices: a ``loss_fn`` that compares by cosine (every function above except
    ``triplet_loss``) normalises the slice itself, which is the renormalised truncation; the Euclidean
    triplet loss sees the slice as it is. ``loss_fn`` is called once per dimension, in the order given.

    embeddings: each (B, H) with H >= max(dims); dims: positive ints; weights: one per dim, default 1
    """
    weights = [1.0] * len(dims) if weights is None else list(weights)
    if len(weights) != len(dims) or not dims:
        raise ValueError(f"matryoshka: {len(dims)} dims and {len(weights)} weights")
    total, parts = None, {}
    for dim, weight in zip(dims, weights):
        loss = loss_fn([e[..., :dim] for e in embeddings])  # each (B, dim)
        parts[int(dim)] = loss.detach()
        total = weight * loss if total is None else total + weight * loss
    return total, parts


# --------------------------------------------------------------------------- Wang & Isola metrics


def alignment(x: Tensor, y: Tensor, alpha: float = 2) -> Tensor:
    """Alignment of Wang & Isola (2020): ``mean_i ||x_i - y_i||^alpha`` over positive pairs.

    Inputs are L2-normalised here (the metric is defined on the hypersphere); lower is better.
    x, y: (B, H)
    """
    x = F.normalize(_fp32(x), dim=-1)
    y = F.normalize(_fp32(y), dim=-1)
    return torch.linalg.vector_norm(x - y, dim=-1).pow(alpha).mean()


def uniformity(x: Tensor, t: float = 2) -> Tensor:
    """Uniformity of Wang & Isola (2020): ``log mean_{i<j} exp(-t ||x_i - x_j||^2)``.

    Inputs are L2-normalised here; lower is better. Computed as a logsumexp for stability.
    x: (N, H) with N >= 2
    """
    x = F.normalize(_fp32(x), dim=-1)
    sq_dists = torch.pdist(x, p=2).pow(2)  # (N(N-1)/2,) pairs i<j
    return torch.logsumexp(-t * sq_dists, dim=0) - math.log(sq_dists.numel())


# --------------------------------------------------------------------------- DCLR


def anchor_cosines(anchors: Tensor, others: Tensor) -> Tensor:
    """Cosine of each anchor with shared (k, H) or per-anchor (B, k, H) vectors.

    anchors: (B, H); others: (k, H) or (B, k, H) -> (B, k)
    """
    if others.dim() == 2:
        return cosine_similarity_matrix(anchors, others)  # (B, k)
    a = F.normalize(anchors, dim=-1)  # (B, H)
    o = F.normalize(others, dim=-1)  # (B, k, H)
    return torch.einsum("bh,bkh->bk", a, o)  # (B, k)


def dclr_noise_ascent(
    anchors: Tensor,
    positives: Tensor,
    noise: Tensor,
    tau_u: float = 0.05,
    steps: int = 4,
    beta: float = 1e-3,
    objective: Literal["uniformity", "infonce"] = "uniformity",
    in_batch_negatives: Tensor | None = None,
    relative_step: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DCLR's noise-based negatives, made harder by gradient ascent (Zhou et al., ACL 2022,
    "Debiased Contrastive Learning of Unsupervised Sentence Representations", sec. 4.1).

    The paper's objective for anchor i (sim = cosine, noise j of anchor i)::

        L_U = -log( exp(sim(h_i, h_i+) / tau_u) / sum_j exp(sim(h_i, noise_j) / tau_u) )

    Each of ``steps`` steps moves every noise vector by ``beta`` along its own normalised
    gradient, ``noise_j += beta * g_j / ||g_j||`` with ``g_j = dL_U / dnoise_j`` (ascent: L_U
    grows, the noise becomes a harder negative). Paper defaults: tau_u 0.05, beta 1e-3.

    ``objective="infonce"`` follows the official code instead: the gradient is that of the
    in-batch InfoNCE at temperature tau_u with the noise as extra negatives, whose denominator
    holds the positive, ``in_batch_negatives`` and the noise. ``in_batch_negatives`` must not
    contain the anchor's own positive; the official setting (the other anchors' positives) is
    ``positives.expand(B, B, H)[~torch.eye(B, dtype=torch.bool)].view(B, B - 1, H)``.

    The loop sees anchors and positives detached, treats the noise as its own leaf and calls
    ``torch.autograd.grad`` on it only, so no graph reaches the encoder; it runs in fp32 with
    autocast disabled (and grad enabled), so it is safe under bf16-mixed and inside no_grad.

    ``relative_step``: each step moves a vector by ``beta`` times its own norm, so ``beta`` is the
    angle (in radians, for small beta) the step may turn it by, whatever the noise's scale. With the
    paper's absolute step a vector of norm ~19.6 (sigma 1, H = 384) turns by beta / 19.6.

    How far the noise moves is logged by DCLR (train/noise_cos_shift, train/noise_step_norm; docs/DCLR.md).

    anchors, positives: (B, H)
    noise: (B, k, H) per-anchor noise (the paper) or (k, H) one set shared by the batch
        (the official code)
    in_batch_negatives: (M, H) shared or (B, M, H) per anchor; only used by "infonce"
    Returns the moved noise (detached, fp32 or float64) and detached scalar diagnostics:
    ``cos_before``/``cos_after`` (mean anchor-noise cosine), ``cos_shift`` (after - before),
    ``noise_step_norm`` (mean ||noise_after - noise_before||), ``lu_before``/``lu_after``
    (mean paper L_U) and ``objective_before``/``objective_after`` (the ascended objective).
    """
    _check_positive("tau_u", tau_u)
    if steps < 0 or beta < 0:
        raise ValueError(f"steps and beta must be >= 0, got steps={steps!r}, beta={beta!r}")
    if objective not in ("uniformity", "infonce"):
        raise ValueError(f"objective must be 'uniformity' or 'infonce', got {objective!r}")
    if noise.dim() not in (2, 3):
        raise ValueError(f"noise must be (k, H) or (B, k, H), got shape {tuple(noise.shape)}")

    with torch.enable_grad(), torch.autocast(device_type=anchors.device.type, enabled=False):
        a = _fp32(anchors.detach())  # (B, H)
        pos_logit = F.cosine_similarity(a, positives.detach().to(a.dtype), dim=-1) / tau_u  # (B,)
        neg_logits = None
        if objective == "infonce" and in_batch_negatives is not None:
            neg_logits = anchor_cosines(a, in_batch_negatives.detach().to(a.dtype)) / tau_u  # (B, M)

        def lu(noise_logits: Tensor) -> Tensor:
            return (torch.logsumexp(noise_logits, dim=-1) - pos_logit).mean()

        def infonce(noise_logits: Tensor) -> Tensor:
            parts = [pos_logit[:, None]] + ([neg_logits] if neg_logits is not None else [])
            logits = torch.cat(parts + [noise_logits], dim=-1)  # (B, 1 + M + k), positive first
            return (torch.logsumexp(logits, dim=-1) - pos_logit).mean()

        ascended = lu if objective == "uniformity" else infonce
        start = noise.detach().to(a.dtype).clone()
        current = start
        with torch.no_grad():
            logits0 = anchor_cosines(a, start) / tau_u  # (B, k)
            cos_before, lu_before, obj_before = logits0.mean() * tau_u, lu(logits0), ascended(logits0)
        for _ in range(steps):
            current = current.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(ascended(anchor_cosines(a, current) / tau_u), current)
            # One unit direction per noise vector (last dim), so every vector moves by beta.
            direction = grad / torch.linalg.vector_norm(grad, dim=-1, keepdim=True).clamp_min(1e-12)
            size = beta * torch.linalg.vector_norm(current, dim=-1, keepdim=True) if relative_step else beta
            current = current.detach() + size * direction
        current = current.detach()
        with torch.no_grad():
            logits1 = anchor_cosines(a, current) / tau_u  # (B, k)
            cos_after = logits1.mean() * tau_u
            diagnostics = {
                "cos_before": cos_before,
                "cos_after": cos_after,
                "cos_shift": cos_after - cos_before,
                "noise_step_norm": torch.linalg.vector_norm(current - start, dim=-1).mean(),
                "lu_before": lu_before,
                "lu_after": lu(logits1),
                "objective_before": obj_before,
                "objective_after": ascended(logits1),
            }
    return current, diagnostics


def dclr_weights(
    comp_anchor_sims: Tensor,
    phi: float,
    rule: Literal["paper", "official"] = "paper",
    temperature: float = 0.05,
) -> Tensor:
    """DCLR's instance weights (Zhou et al. 2022, eq. 4): drop likely false negatives.

    ``comp_anchor_sims`` holds the complementary model's cosines between each anchor and each
    negative. "paper": weight 0 where ``cos >= phi``, else 1. "official": the official code's
    strict ``cos / temperature > phi / temperature`` (so a cosine exactly at phi is kept). The
    official code hard-codes ``phi * 20``, right only at temperature 0.05; here the threshold
    is derived from ``temperature``. phi is in (0, 1] (the paper tunes it per backbone).

    comp_anchor_sims: (B, N) -> weights (B, N) float in {0, 1}
    """
    if not 0 < phi <= 1:
        raise ValueError(f"phi must be in (0, 1], got {phi!r}")
    sims = _fp32(comp_anchor_sims.detach())  # (B, N)
    if rule == "paper":
        keep = sims < phi
    elif rule == "official":
        _check_positive("temperature", temperature)
        # Both sides divided in the same dtype, so a cosine equal to phi stays equal to it.
        threshold = torch.tensor(phi, dtype=sims.dtype, device=sims.device) / temperature
        keep = ~(sims / temperature > threshold)
    else:
        raise ValueError(f"rule must be 'paper' or 'official', got {rule!r}")
    return keep.to(sims.dtype)


def dclr_loss(
    pos_sims: Tensor,
    neg_sims: Tensor,
    weights: Tensor,
    temperature: float = 0.05,
    masked: Literal["remove", "zero_logit"] = "remove",
) -> Tensor:
    """DCLR's weighted InfoNCE (Zhou et al. 2022, eq. 5); the positive is always kept::

        L = mean_i -log( exp(pos_i / tau) / (exp(pos_i / tau) + sum_j w_ij exp(neg_ij / tau)) )

    "remove": the weight multiplies exp, so a weight-0 negative vanishes (computed as a
    logsumexp with ``log w = -inf``). "zero_logit": the official code's behaviour, which
    multiplies the logits by the weights, so a masked negative's logit is 0 and it still adds
    ``exp(0) = 1`` to the denominator. Paper temperature 0.05.

    pos_sims: (B,) cosines; neg_sims, weights: (B, N)
    """
    _check_positive("temperature", temperature)
    pos_logits = _fp32(pos_sims) / temperature  # (B,)
    neg_logits = _fp32(neg_sims) / temperature  # (B, N)
    w = _fp32(weights.detach()).to(neg_logits.dtype)
    if masked == "remove":
        neg_logits = neg_logits + torch.log(w)  # log 0 = -inf: the negative drops out
    elif masked == "zero_logit":
        neg_logits = neg_logits * w
    else:
        raise ValueError(f"masked must be 'remove' or 'zero_logit', got {masked!r}")
    logits = torch.cat([pos_logits[:, None], neg_logits], dim=-1)  # (B, 1 + N)
    return (torch.logsumexp(logits, dim=-1) - pos_logits).mean()


def dclr_official_loss(pos_sims: Tensor, neg_sims: Tensor, weights: Tensor, temperature: float = 0.05) -> Tensor:
    """The loss DCLR's official code computes in place of the paper's eq. 5.

    It multiplies the logits by the weights (a masked negative's logit becomes 0), takes the
    softmax over each anchor's row ``[positive, negatives]``, and averages a binary cross-entropy
    against the one-hot positive over all B x (1 + N) entries::

        p = softmax([pos_i / tau, w_ij * neg_ij / tau])
        L = mean_{i, j} -( y_ij log p_ij + (1 - y_ij) log(1 - p_ij) ),   y_ij = [j is the positive]

    On the same logits this is about (1 + N) times smaller than the row cross-entropy, and each
    negative is also pushed down through its own ``log(1 - p)`` term. ``log(1 - p)`` is computed
    as ``log(-expm1(log p))`` (stable when p is near 1) in fp32.

    pos_sims: (B,) cosines; neg_sims, weights: (B, N)
    """
    _check_positive("temperature", temperature)
    pos_logits = _fp32(pos_sims) / temperature  # (B,)
    neg_logits = _fp32(neg_sims) / temperature * _fp32(weights.detach())  # (B, N)
    logits = torch.cat([pos_logits[:, None], neg_logits], dim=-1)  # (B, 1 + N), positive first
    log_p = torch.log_softmax(logits, dim=-1)
    log_not_p = _log1mexp(log_p)  # log(1 - p)
    target = torch.zeros_like(log_p)
    target[:, 0] = 1.0
    return -(target * log_p + (1 - target) * log_not_p).mean()


def _log1mexp(x: Tensor) -> Tensor:
    """``log(1 - exp(x))`` for x <= 0, accurate at both ends (Maechler 2012)."""
    x = x.clamp(max=-1e-30)
    return torch.where(x > -0.6931471805599453, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def quantile_threshold(comp_sims: Tensor, q: float) -> Tensor:
    """The q-quantile of a batch's complementary cosines: a threshold that masks the top ``1 - q``
    fraction of the batch's negatives whatever the complementary model's cosine scale."""
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    return torch.quantile(_fp32(comp_sims.detach()).flatten(), q)


def distillation_kl(teacher_sims: Tensor, student_sims: Tensor, temperature: float) -> Tensor:
    """Mean over anchors of KL(p_teacher || p_student), each row the softmax of cosines / temperature over
    the same in-batch candidates; the teacher's cosines carry no gradient. DCLR's distillation ablation
    (``DCLR(distillation_weight=W)``): the complementary SimCSE teaches through its similarity distribution
    instead of masking negatives (``dclr_weights``). Zero when both rows agree.

    teacher_sims, student_sims: (B, C) -> scalar

        >>> teacher = torch.tensor([[0.9, 0.2, 0.1]])
        >>> float(distillation_kl(teacher, teacher, 0.05))
        0.0
    """
    _check_positive("temperature", temperature)
    teacher = F.log_softmax(_fp32(teacher_sims).detach() / temperature, dim=-1)  # (B, C)
    student = F.log_softmax(_fp32(student_sims) / temperature, dim=-1)  # (B, C)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")
