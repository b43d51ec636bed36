"""FILM's input: feature columns checked and L2-normalised, and their truncated SVD (the reduced coordinates)."""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

DTYPE = torch.float64  # all of FILM's maths


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
    X = torch.as_tensor(np.asarray(X) if not isinstance(X, Tensor) else X).to(DTYPE)
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
