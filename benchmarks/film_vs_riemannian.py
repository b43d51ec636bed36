"""FILM's Cayley + Barzilai-Borwein + non-monotone search vs geoopt's RiemannianSGD / RiemannianAdam.

All methods minimise the same objective from the same start: F(P) = min_{s>=0} f(P, s) of
``lightning_modules/film_solver.py``, P on St(r, d) (geoopt's canonical Stiefel, whose retraction
is the same Cayley transform FILM uses), s re-solved in closed form (``solve_scales``, warm
started) at every step for every method -- s is never a learned parameter. The baselines take the
autograd gradient of f(P, s) with s fixed (Danskin: the gradient of F up to anchors exactly on
the margin). SVD and triplet statistics are computed once and shared; only the loops are timed.

Target: FILM's final loss + 1% (losses are positive). Reported: median over 3 repetitions,
methods interleaved within each repetition, of the seconds (and steps) to reach it. The
baselines' learning rates are picked by a short pilot run per problem over a small grid (the
best case for them); RiemannianSGD uses momentum 0.9. One torch thread for everyone.

Problems: a planted synthetic one (group structure in a random subspace, plus a stronger
nuisance clustering) and, with ``--data_dir DIR`` holding ``nli/snli.dev.tsv``, SNLI dev
triplets (premise, entailment, contradiction) over TF-IDF features.

    python benchmarks/film_vs_riemannian.py [--data_dir $SENTEMB_DATA] [--budget 12]
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

import geoopt
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datamodules.nli import LABELS  # noqa: E402
from datamodules.triplets import nli_triplets, triplets_from_groups  # noqa: E402
from encoders.tfidf import tfidf_features  # noqa: E402
from lightning_modules.film_solver import FILM, FILMState, hinge_objective, solve_scales  # noqa: E402

DT = torch.float64


def synthetic_problem(n: int = 3000, D: int = 300, k: int = 8, n_groups: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(D, 2 * k, generator=g, dtype=DT))[0]
    centres = 3 * torch.nn.functional.normalize(torch.randn(n_groups, k, generator=g, dtype=DT), dim=1)
    nuisance = 3 * torch.nn.functional.normalize(torch.randn(n_groups, k, generator=g, dtype=DT), dim=1)
    group = torch.randint(0, n_groups, (n,), generator=g)
    other = torch.randint(0, n_groups, (n,), generator=g)
    u = centres[group] + 0.5 * torch.randn(n, k, generator=g, dtype=DT)
    v = nuisance[other] + 0.5 * torch.randn(n, k, generator=g, dtype=DT)
    X = (u @ basis[:, :k].T + v @ basis[:, k:].T + 0.2 * torch.randn(n, D, generator=g, dtype=DT)).T
    return X, triplets_from_groups(group, n_per_anchor=5, seed=seed)  # (D, n), (m, 3)


def nli_problem(data_dir: Path, max_rows: int | None = None):
    ids: dict[str, int] = {}
    premise, hypothesis, labels = [], [], []
    with open(data_dir / "nli" / "snli.dev.tsv", encoding="utf-8") as fh:
        header = fh.readline().rstrip("\n").split("\t")
        assert header[:3] == ["premise", "hypothesis", "label"], header
        for row, line in enumerate(fh):
            if max_rows is not None and row >= max_rows:
                break
            p, h, label = line.rstrip("\n").split("\t")[:3]
            premise.append(ids.setdefault(p, len(ids)))
            hypothesis.append(ids.setdefault(h, len(ids)))
            labels.append(LABELS.index(label))
    X, _ = tfidf_features(list(ids), min_df=2)
    return X, torch.tensor(nli_triplets(premise, hypothesis, labels, every_combination=True), dtype=torch.long)


def fresh(state: FILMState) -> FILMState:
    out = copy.deepcopy(state)
    out.t0 = time.perf_counter()
    return out


def run_film(film: FILM, state0: FILMState, max_iter: int):
    state = fresh(state0)
    for _ in range(max_iter):
        film.step(state)
        if state.converged:
            break
    times = [h["time"] for h in state.history]
    losses = [h["loss"] for h in state.history]
    return losses, times


def run_riemannian(kind: str, lr: float, film: FILM, state0: FILMState, target: float, budget: float):
    """Steps until F(P) <= target or ``budget`` seconds; returns (seconds, steps, last loss)."""
    Za, Wa = state0.Za, state0.Wa
    P = geoopt.ManifoldParameter(state0.P.clone(), manifold=geoopt.Stiefel(canonical=True))
    if kind == "RiemannianSGD":
        opt = geoopt.optim.RiemannianSGD([P], lr=lr, momentum=0.9)
    else:
        opt = geoopt.optim.RiemannianAdam([P], lr=lr)
    s = state0.s.clone()
    t0 = time.perf_counter()
    loss, steps = math.inf, 0
    while True:
        with torch.no_grad():
            ZP, WP = Za @ P, Wa @ P  # (N, d)
            s, _, f = solve_scales(ZP, WP, film.margin, film.l2, film.smooth, s, film.inner_iter)
        loss = f.item()
        elapsed = time.perf_counter() - t0
        if loss <= target or elapsed > budget or not math.isfinite(loss):
            return (elapsed if loss <= target else math.inf), steps, loss
        opt.zero_grad()
        objective, _ = hinge_objective(Za @ P, Wa @ P, s, film.margin, film.l2)  # s held fixed
        objective.backward()
        opt.step()
        steps += 1


def time_to(target: float, losses: list[float], times: list[float]) -> tuple[float, int]:
    for step, (loss, t) in enumerate(zip(losses, times), start=1):
        if loss <= target:
            return t, step
    return math.inf, len(losses)


def benchmark(name: str, X, triplets, film: FILM, budget: float, reps: int = 3) -> dict:
    t = time.perf_counter()
    state0 = film.init_state(X, triplets)
    setup = time.perf_counter() - t
    r, d = state0.P.shape
    losses, _ = run_film(film, state0, film.max_iter)
    target = losses[-1] * 1.01
    print(f"\n== {name}: D={X.shape[0]} n={X.shape[1]} anchors={state0.Za.shape[0]} triplets={len(triplets)} "
          f"r={r} d={d} (setup {setup:.1f}s) | start loss {state0.loss:.4f}, FILM final {losses[-1]:.4f}, "
          f"target {target:.4f}")

    grids = {"RiemannianSGD": [0.03, 0.1, 0.3, 1.0, 3.0], "RiemannianAdam": [3e-2, 1e-1, 3e-1, 1.0, 3.0, 10.0]}
    rgrad0 = torch.linalg.matrix_norm(state0.rgrad).item()
    chosen, pilot_seconds = {}, {}
    for kind, grid in grids.items():
        pilot, t_pilot = {}, time.perf_counter()
        for c in grid:
            lr = c / rgrad0 if kind == "RiemannianSGD" else c  # SGD: c = rotation per step at start
            sec, _, last = run_riemannian(kind, lr, film, state0, target, budget / 3)
            pilot[lr] = (sec, last)
        chosen[kind] = min(pilot, key=lambda lr: pilot[lr])
        pilot_seconds[kind] = time.perf_counter() - t_pilot
        outcomes = (f"{v[0]:.2f}s" if v[0] < math.inf else f"loss {v[1]:.4f}" for v in pilot.values())
        print(f"   pilot {kind}: " + ", ".join(f"lr={lr:.3g}: {o}" for lr, o in zip(pilot, outcomes)))

    results: dict[str, dict[str, list]] = {m: {"sec": [], "steps": [], "loss": []} for m in ["FILM", *grids]}
    for _ in range(reps):  # interleaved
        losses, times = run_film(film, state0, film.max_iter)
        sec, steps = time_to(target, losses, times)
        results["FILM"]["sec"].append(sec), results["FILM"]["steps"].append(steps)
        results["FILM"]["loss"].append(losses[-1])
        for kind in grids:
            sec, steps, last = run_riemannian(kind, chosen[kind], film, state0, target, budget)
            results[kind]["sec"].append(sec), results[kind]["steps"].append(steps), results[kind]["loss"].append(last)

    rows = {}
    print(f"   {'method':<16}{'lr':>10}{'median s':>11}{'steps':>8}{'reached':>9}{'last loss':>11}{'lr search s':>13}")
    for method, res in results.items():
        reached = sum(s < math.inf for s in res["sec"])
        med = statistics.median(res["sec"])
        rows[method] = dict(lr=chosen.get(method), lr_search_seconds=pilot_seconds.get(method, 0.0),
                            median_seconds=med if med < math.inf else None,
                            median_steps=statistics.median(res["steps"]), reached=f"{reached}/{reps}",
                            last_loss=statistics.median(res["loss"]))
        lr = f"{chosen[method]:.3g}" if method in chosen else "BB"
        sec = f"{med:.3f}" if med < math.inf else f">{budget:.0f}"
        print(f"   {method:<16}{lr:>10}{sec:>11}{statistics.median(res['steps']):>8.0f}"
              f"{reached:>7}/{reps}{statistics.median(res['loss']):>11.4f}{pilot_seconds.get(method, 0.0):>13.1f}")
    return dict(problem=name, D=X.shape[0], n=X.shape[1], r=r, d=d, triplets=len(triplets),
                start_loss=state0.loss, film_final_loss=losses[-1], target=target, methods=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", type=Path, default=None, help="folder holding nli/snli.dev.tsv")
    parser.add_argument("--budget", type=float, default=12.0, help="seconds per baseline run (pilot: a third)")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = []
    X, triplets = synthetic_problem()
    out.append(benchmark("synthetic", X, triplets, FILM(dim=8, rank=64, l2=0.1, init="random", max_iter=500),
                         args.budget, args.reps))
    if args.data_dir is not None:
        X, triplets = nli_problem(args.data_dir)
        out.append(benchmark("snli-dev-tfidf", X, triplets,
                             FILM(dim=16, rank=128, l2=0.1, init="random", max_iter=500), args.budget, args.reps))
    print(json.dumps({"benchmark": "film_vs_riemannian", "results": out}))


if __name__ == "__main__":
    main()
