"""FILM solver maths: gradients, Cayley curve, closed-form scales, planted recovery, bad inputs."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from datamodules.triplets import groups_from_pairs, nli_triplets, triplets_from_groups, triplets_from_scored_pairs
from encoders.tfidf import tfidf_features
from harness.pair_knn import knn_match_proba, knn_pair_match, select_k
from lightning_modules.film_solver import (
    FILM,
    anchor_statistics,
    cayley_dense,
    cayley_smw,
    closed_form_scales,
    hinge_objective,
    objective_gradient,
    solve_scales,
    triplet_accuracy,
)

DT = torch.float64


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _small_problem(n=40, r=7, d=3, seed=0):
    """Reduced coordinates with 4 noisy groups, their triplets, and a point P on St(r, d)."""
    g = _gen(seed)
    groups = torch.arange(n) % 4
    centres = torch.randn(4, r, generator=g, dtype=DT)
    Zt = centres[groups] + torch.randn(n, r, generator=g, dtype=DT)  # (n, r)
    triplets = triplets_from_groups(groups, n_per_anchor=3, seed=seed)
    _, Za, Wa = anchor_statistics(Zt, triplets)
    P = torch.linalg.qr(torch.randn(r, d, generator=g, dtype=DT))[0]
    return Za, Wa, P


def _planted(n: int, seed: int, D: int = 50, n_groups: int = 6):
    """Groups live in a random 3-dim subspace of R^D; a stronger nuisance clustering, unrelated to
    the groups, lives in another 3-dim subspace; small isotropic noise everywhere."""
    g = _gen(1234)  # the subspaces and centres are shared by train and test
    basis = torch.linalg.qr(torch.randn(D, 6, generator=g, dtype=DT))[0]
    signal, nuisance = basis[:, :3], basis[:, 3:]
    centres = 3 * torch.nn.functional.normalize(torch.randn(n_groups, 3, generator=g, dtype=DT), dim=1)
    nuisance_centres = 3 * torch.nn.functional.normalize(torch.randn(n_groups, 3, generator=g, dtype=DT), dim=1)
    g = _gen(seed)
    group = torch.randint(0, n_groups, (n,), generator=g)
    other = torch.randint(0, n_groups, (n,), generator=g)
    u = centres[group] + 0.3 * torch.randn(n, 3, generator=g, dtype=DT)
    v = nuisance_centres[other] + 0.3 * torch.randn(n, 3, generator=g, dtype=DT)
    X = (u @ signal.T + v @ nuisance.T + 0.15 * torch.randn(n, D, generator=g, dtype=DT)).T  # (D, n)
    return X, group, signal


# --------------------------------------------------------------------------- gradients


def _fd_check(fun, P, G, n_dirs=4, eps=1e-6, seed=1):
    g = _gen(seed)
    for _ in range(n_dirs):
        E = torch.randn(P.shape, generator=g, dtype=DT)
        fd = (fun(P + eps * E) - fun(P - eps * E)) / (2 * eps)
        assert fd == pytest.approx((G * E).sum().item(), rel=1e-6, abs=1e-9)


def test_gradient_fixed_s_matches_finite_differences():
    Za, Wa, P = _small_problem()
    s = torch.tensor([0.7, 0.3, 1.1], dtype=DT)
    margin = 0.5
    _, active = hinge_objective(Za @ P, Wa @ P, s, margin, 1.0)
    assert 0 < int(active.sum()) < len(active), "want a mixed active set"
    G = objective_gradient(Za, Wa, Za @ P, Wa @ P, s, active, 1.0, fixed_s=True)

    def f(Q):
        return hinge_objective(Za @ Q, Wa @ Q, s, margin, 1.0)[0].item()

    _fd_check(f, P, G)


@pytest.mark.parametrize("smooth", [None, 0.05])
def test_gradient_with_closed_form_s_matches_finite_differences(smooth):
    # A large margin keeps every anchor active, so F(P) = f(P, s(P)) is smooth around P.
    Za, Wa, P = _small_problem(seed=3)
    margin, l2 = 100.0, 0.5

    def solve(Q):
        return solve_scales(Za @ Q, Wa @ Q, margin, l2, smooth)

    s, active, _ = solve(P)
    assert bool(active.all()) and bool((s > 0).any())
    G = objective_gradient(Za, Wa, Za @ P, Wa @ P, s, active, l2, smooth)
    _fd_check(lambda Q: solve(Q)[2].item(), P, G)


# --------------------------------------------------------------------------- Cayley curve


def test_smw_cayley_equals_dense_cayley():
    g = _gen(5)
    r, d = 30, 4
    P = torch.linalg.qr(torch.randn(r, d, generator=g, dtype=DT))[0]
    G = torch.randn(r, d, generator=g, dtype=DT)
    W = G @ P.T - P @ G.T  # (r, r) skew
    eye = torch.eye(r, dtype=DT)
    for tau in (1e-3, 0.3, 2.0):
        explicit = torch.linalg.solve(eye + tau / 2 * W, (eye - tau / 2 * W) @ P)
        dense = cayley_dense(P, G, tau)  # geoopt's retraction
        smw = cayley_smw(P, G, tau)
        assert torch.allclose(dense, explicit, atol=1e-12, rtol=0)
        assert (smw - dense).abs().max().item() < 1e-10
        assert torch.linalg.matrix_norm(smw.T @ smw - torch.eye(d, dtype=DT)).item() < 1e-12


def test_cayley_curve_slope_is_minus_half_w_norm_squared():
    Za, Wa, P = _small_problem(seed=4)
    margin, l2 = 100.0, 0.5
    s, active, _ = solve_scales(Za @ P, Wa @ P, margin, l2)
    G = objective_gradient(Za, Wa, Za @ P, Wa @ P, s, active, l2)
    W = G @ P.T - P @ G.T

    def F(tau):
        Y = cayley_dense(P, G, tau)
        return solve_scales(Za @ Y, Wa @ Y, margin, l2)[2].item()

    h = 1e-6
    slope = (F(h) - F(-h)) / (2 * h)
    assert slope == pytest.approx(-0.5 * torch.linalg.matrix_norm(W).item() ** 2, rel=1e-5)


def test_P_stays_orthonormal_over_200_steps():
    X, group, _ = _planted(200, seed=0)
    triplets = triplets_from_groups(group, 3, seed=0)
    film = FILM(dim=4, rank=20, l2=0.1, init="random")
    state = film.init_state(X, triplets)
    for _ in range(200):  # no early stop: step on even after convergence
        info = film.step(state)
        assert info["orthogonality_error"] < 1e-6
    eye = torch.eye(4, dtype=DT)
    assert torch.linalg.matrix_norm(state.P.T @ state.P - eye).item() < 1e-6
    assert set(info) >= {"loss", "active_set_size", "step_size", "orthogonality_error", "time"}


# --------------------------------------------------------------------------- scales


def test_closed_form_s_is_optimal_for_fixed_P_and_active_set():
    Za, Wa, P = _small_problem(seed=7)
    ZP, WP = Za @ P, Wa @ P
    margin, l2 = 0.5, 0.3
    _, active = hinge_objective(ZP, WP, torch.full((3,), 0.5, dtype=DT), margin, l2)
    n_active, N = int(active.sum()), len(active)

    def surrogate(s):  # the objective with the active set held fixed
        return margin * n_active / N - ((ZP * WP)[active] @ s).sum() / N + 0.5 * l2 * (s @ s)

    s_star = closed_form_scales(ZP, WP, active, l2)
    best = surrogate(s_star).item()
    grid = torch.linspace(0, 3 * s_star.max().item() + 1, 301, dtype=DT)
    for l in range(3):  # brute force along each coordinate, s >= 0
        for value in grid:
            s = s_star.clone()
            s[l] = value
            assert surrogate(s).item() >= best - 1e-12
    for eps in torch.randn(20, 3, generator=_gen(0), dtype=DT) * 0.1:
        assert surrogate((s_star + eps).clamp(min=0)).item() >= best - 1e-12


def _reference_scales(ZP, WP, margin, l2):
    """Naive second solver: the primal QP in (s, slack) by SLSQP."""
    from scipy.optimize import minimize

    g = (ZP * WP).numpy()  # (N, d)
    N, d = g.shape
    result = minimize(
        lambda v: v[d:].mean() + 0.5 * l2 * v[:d] @ v[:d],
        np.concatenate([np.zeros(d), np.full(N, margin)]),
        jac=lambda v: np.concatenate([l2 * v[:d], np.full(N, 1 / N)]),
        constraints=[{"type": "ineq", "fun": lambda v: g @ v[:d] + v[d:] - margin,
                      "jac": lambda v: np.hstack([g, np.eye(N)])}],
        bounds=[(0, None)] * (d + N), method="SLSQP", options={"ftol": 1e-14, "maxiter": 1000},
    )
    return torch.from_numpy(result.x[:d])


@pytest.mark.parametrize("seed", [0, 4, 7])
def test_solved_s_matches_a_reference_qp_solver(seed):
    Za, Wa, P = _small_problem(seed=seed)
    ZP, WP = Za @ P, Wa @ P
    margin, l2 = 0.5, 0.3
    s_ref = _reference_scales(ZP, WP, margin, l2)
    f_ref = hinge_objective(ZP, WP, s_ref, margin, l2)[0].item()
    s0 = torch.tensor([0.5, 0.0, 2.0], dtype=DT)
    f_start = hinge_objective(ZP, WP, s0, margin, l2)[0].item()
    for start in (None, s0):
        s, alpha, f = solve_scales(ZP, WP, margin, l2, s0=start)
        assert f.item() <= f_start
        assert f.item() == pytest.approx(f_ref, rel=1e-9)  # the minimum puts anchors on the margin
        assert torch.allclose(s, s_ref, atol=1e-5)
        on_margin = (alpha > 0) & (alpha < 1)
        assert 0 < int(on_margin.sum()) <= 3
        assert torch.allclose(s, closed_form_scales(ZP, WP, alpha, l2), atol=1e-12)


def test_gradient_at_kinks_uses_fractional_weights():
    # Mixed active set with anchors exactly on the margin: F(P) = min_s f(P, s) is still
    # differentiable and its gradient is -2 M_alpha P diag(s) (Danskin on the dual).
    Za, Wa, P = _small_problem(seed=1)
    margin, l2 = 0.5, 0.3

    def solve(Q):
        return solve_scales(Za @ Q, Wa @ Q, margin, l2)

    s, alpha, _ = solve(P)
    assert bool(((alpha > 0) & (alpha < 1)).any()) and bool((alpha == 0).any())
    G = objective_gradient(Za, Wa, Za @ P, Wa @ P, s, alpha, l2)
    _fd_check(lambda Q: solve(Q)[2].item(), P, G, eps=1e-6)


# --------------------------------------------------------------------------- recovery


def test_planted_low_rank_metric_is_recovered():
    X_train, g_train, signal = _planted(800, seed=0)
    X_test, g_test, _ = _planted(300, seed=1)
    t_train = triplets_from_groups(g_train, 10, seed=0)
    t_test = triplets_from_groups(g_test, 5, seed=1)
    X_unit = X_test / X_test.norm(dim=0)
    raw = triplet_accuracy(X_unit.T, t_test)
    oracle = triplet_accuracy((signal.T @ X_unit).T, t_test)
    assert raw < 0.85 < 0.99 < oracle  # the nuisance clustering fools the raw cosine

    film = FILM(dim=3, l2=1.0).fit(X_train, t_train)
    assert film.history_[-1]["loss"] < film.history_[0]["loss"]
    emb = film.transform(X_test)
    assert isinstance(emb, torch.Tensor) and emb.shape == (300, 3)
    assert triplet_accuracy(emb, t_test) > 0.95
    assert film.L_.shape == (3, 50) and film.P_.shape == (50, 3) and film.s_.shape == (3,)


def test_minibatch_film_reduces_the_loss():
    X, group, _ = _planted(600, seed=2)
    triplets = triplets_from_groups(group, 5, seed=0)
    film = FILM(dim=3, rank=20, l2=0.1, minibatch=64, max_iter=150, init="random")
    state = film.init_state(X, triplets)
    before = film.objective(state)
    for _ in range(film.max_iter):
        film.step(state)
    film.finalize(state)
    after = film.objective(state)
    assert after < 0.7 * before
    assert film.loss_ == pytest.approx(after)


def test_sparse_tfidf_fit_and_transform():
    sentences = [
        "a dog runs in the park", "the dog is running in a park", "a cat sleeps on the sofa",
        "the cat is sleeping on a couch", "a man plays guitar", "the man is playing a guitar",
    ] * 2
    X, vectorizer = tfidf_features(sentences)
    assert sp.issparse(X) and X.shape == (len(vectorizer.vocabulary_), 12)
    groups = groups_from_pairs(12, [(0, 1), (2, 3), (4, 5), (0, 6), (2, 8), (4, 10), (1, 7), (3, 9), (5, 11)])
    film = FILM(dim=2, rank=5).fit(X, triplets_from_groups(groups, 4, seed=0))
    emb = film.transform(X)
    assert isinstance(emb, np.ndarray) and emb.shape == (12, 2) and np.isfinite(emb).all()


# --------------------------------------------------------------------------- triplets


def test_groups_from_pairs_are_connected_components():
    groups = groups_from_pairs(7, [(0, 1), (3, 4), (1, 2), (6, 4)])
    assert groups.tolist() == [0, 0, 0, 1, 1, 2, 1]


def test_triplets_from_groups_are_valid():
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 3])
    t = triplets_from_groups(groups, n_per_anchor=20, seed=0)
    i, j, k = t.unbind(1)
    assert set(i.tolist()) == {0, 1, 2, 3, 4}  # singletons 5 and 6 cannot anchor
    assert bool((groups[i] == groups[j]).all() and (i != j).all() and (groups[i] != groups[k]).all())
    assert set(k.tolist()) >= {5, 6}


def test_scored_pairs_and_nli_triplets():
    t = triplets_from_scored_pairs([(0, 1), (0, 2), (3, 4)], [4.5, 1.0, 4.0], threshold=3.0, n=6, n_per_anchor=3)
    assert {tuple(row) for row in t[t[:, 0] == 0].tolist()} == {(0, 1, 2)}  # its low-scored partner
    rows = t[t[:, 0] == 3]
    assert bool((rows[:, 1] == 4).all()) and not bool(torch.isin(rows[:, 2], torch.tensor([3, 4])).any())
    # NLI labels: 0 entailment, 1 neutral, 2 contradiction
    assert nli_triplets([0, 0, 0, 5], [1, 2, 3, 6], [0, 2, 1, 0], every_combination=True) == [(0, 1, 2)]
    premises, hypotheses, labels = ["p", "p", "p", "p", "q"], ["e1", "e2", "c1", "c2", "e3"], [0, 0, 2, 2, 0]
    assert nli_triplets(premises, hypotheses, labels) == [("p", "e1", "c1"), ("p", "e2", "c2")]  # each entailment once
    assert nli_triplets(premises, hypotheses, labels, every_combination=True) == [
        ("p", "e1", "c1"), ("p", "e1", "c2"), ("p", "e2", "c1"), ("p", "e2", "c2")]


# --------------------------------------------------------------------------- pair matching


def test_knn_pair_match_mutual_neighbours_and_select_k():
    # Pairs 0 and 1 sit together; pair 2's sentences sit in different, crowded regions.
    a = torch.tensor([[10.0, 0.0], [0.0, 10.0], [7.0, 7.0]], dtype=DT)
    b = torch.tensor([[9.0, 0.5], [0.5, 9.0], [-7.0, 7.0]], dtype=DT)
    assert knn_pair_match(a, b, k=1).tolist() == [True, True, False]
    assert knn_match_proba(a, b, k=1).tolist() == [0.75, 0.75, 0.25]
    assert knn_pair_match(a, b, k=5).all()  # every other sentence is within 5 neighbours
    best, ce = select_k(a, b, [1, 1, 0], candidates=[5, 1, 2])
    assert best == 1 and set(ce) == {1, 2, 5} and ce[1] < ce[5]


# --------------------------------------------------------------------------- bad inputs


def test_dim_larger_than_rank():
    X = torch.randn(20, 30, generator=_gen(0), dtype=DT)
    t = triplets_from_groups(torch.arange(30) % 3, 2)
    with pytest.raises(ValueError, match="larger than the rank r=5"):
        FILM(dim=8, rank=5).fit(X, t)
    low_rank = torch.randn(20, 2, generator=_gen(0), dtype=DT) @ torch.randn(2, 30, generator=_gen(1), dtype=DT)
    with pytest.raises(ValueError, match="larger than the numerical rank r=2"):
        FILM(dim=3, rank=10).fit(low_rank, t)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_features(bad):
    X = torch.randn(10, 12, generator=_gen(0), dtype=DT)
    X[3, 4] = bad
    t = triplets_from_groups(torch.arange(12) % 3, 2)
    with pytest.raises(ValueError, match="NaN or inf"):
        FILM(dim=2).fit(X, t)
    with pytest.raises(ValueError, match="NaN or inf"):
        FILM(dim=2).fit(sp.csc_matrix(X.numpy()), t)


def test_tfidf_empty_vocabulary_and_single_sentence():
    with pytest.raises(ValueError, match="empty vocabulary"):
        tfidf_features(["the and of", "a an the"], stop_words="english")
    with pytest.raises(ValueError, match="at least two sentences"):
        tfidf_features(["only one sentence here"])


def test_no_triplets():
    with pytest.raises(ValueError, match="no triplets could be generated from the data"):
        triplets_from_groups([0, 1, 2, 3])  # all singletons
    with pytest.raises(ValueError, match="no triplets could be generated from the data"):
        triplets_from_groups([5, 5, 5])  # a single group: no negatives
    with pytest.raises(ValueError, match="no triplets could be generated from the data"):
        triplets_from_scored_pairs([(0, 1)], [1.0], threshold=3.0, n=4)
    assert nli_triplets([0, 0], [1, 2], [0, 1]) == []  # no premise with a contradiction: FILM's data path says so
    with pytest.raises(ValueError, match="no triplets could be generated from the data"):
        FILM(dim=2).fit(torch.randn(5, 8, dtype=DT), torch.empty(0, 3, dtype=torch.long))
