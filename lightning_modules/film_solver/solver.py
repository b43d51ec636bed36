"""The FILM solver: state, the full-batch Cayley/BB/non-monotone step, M-FILM's mini-batch step, and transform."""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from .cayley import _STIEFEL, _orthogonality_error, cayley_dense, cayley_smw
from .hinge import anchor_statistics, objective_gradient
from .lowrank import DTYPE, _prepare_features, _truncated_svd
from .scales import solve_scales

NO_TRIPLETS = "no triplets could be generated from the data"


def _check_triplets(triplets: Any, n: int | None) -> Tensor:
    t = torch.as_tensor(triplets.cpu() if isinstance(triplets, Tensor) else np.asarray(triplets))
    if t.numel() == 0:
        raise ValueError(f"{NO_TRIPLETS}: the triplet tensor is empty")
    if t.dim() != 2 or t.shape[1] != 3 or t.is_floating_point():
        raise ValueError(f"triplets must be an integer (m, 3) tensor, got {tuple(t.shape)} {t.dtype}")
    t = t.long()
    if t.min() < 0 or (n is not None and t.max() >= n):
        raise ValueError(f"triplet indices must lie in [0, {n}), got range [{t.min()}, {t.max()}]")
    return t


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
        keep = S > S[0] * max(D, n) * torch.finfo(DTYPE).eps
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
        P = _STIEFEL.projx(torch.as_tensor(P0, dtype=DTYPE))
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
        return torch.randn(r, self.dim, generator=gen, dtype=DTYPE)

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
