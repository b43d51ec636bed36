"""The Cayley curve on the Stiefel manifold: geoopt's dense retraction and the Sherman-Morrison-Woodbury form."""
from __future__ import annotations

import geoopt
import torch
from torch import Tensor


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
