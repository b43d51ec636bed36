r"""FILM: fast low-rank metric learning on the Stiefel manifold, as pure maths (no Lightning).

Files: ``lowrank.py`` (features and their SVD), ``hinge.py`` (objective and gradient), ``scales.py``
(the inner s solver), ``cayley.py`` (the curve on the manifold), ``solver.py`` (``FILM``: the loop).

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
from .cayley import cayley_dense, cayley_smw
from .hinge import anchor_scores, anchor_statistics, hinge_objective, objective_gradient, triplet_accuracy
from .scales import closed_form_scales, solve_scales
from .solver import FILM, FILMState

__all__ = ["FILM", "FILMState", "anchor_scores", "anchor_statistics", "cayley_dense", "cayley_smw", "closed_form_scales",
           "hinge_objective", "objective_gradient", "solve_scales", "triplet_accuracy"]
