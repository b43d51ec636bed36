"""The scales s for a fixed P: closed form on an active set, the fixed point, and the exact KKT polish."""
from __future__ import annotations

import torch
from torch import Tensor

from .hinge import _coefficients, hinge_objective


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
