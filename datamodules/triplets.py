"""Triplet building, one place for every objective and data family.

- ``nli_triplets``: (premise, entailment, contradiction) of one premise, over sentences or sentence ids.
- ``groups_from_pairs`` and ``triplets_from_groups``: triplets from a clustering of labelled pairs
  (connected components of the positive pairs).
- ``triplets_from_scored_pairs``: triplets from STS-like scored pairs and a threshold.

Index triplets are int64 ``(m, 3)`` tensors ``(i, j, k)``: sentence i is more similar to j than to k.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Hashable, Sequence

import numpy as np
import torch
from torch import Tensor

NO_TRIPLETS = "no triplets could be generated from the data"
ENTAILMENT, CONTRADICTION = 0, 2  # NLI class ids (datamodules.nli.LABELS)


def nli_triplets(
    premises: Sequence[Hashable], hypotheses: Sequence[Hashable], labels: Sequence[int], every_combination: bool = False,
) -> list[tuple[Hashable, Hashable, Hashable]]:
    """(premise, entailment, contradiction) triplets of the same premise, in order of first premise.

    Premises and hypotheses may be sentences or sentence ids; labels are class ids (0 entailment,
    2 contradiction). By default each entailment is used once, paired with the premise's
    contradictions in turn (SBERT's and SimCSE's supervised rows). ``every_combination`` pairs each
    entailment with every contradiction instead (FILM's triplets, where more constraints are cheap),
    skipping a hypothesis labelled both ways.
    """
    ent: dict[Hashable, list[Hashable]] = defaultdict(list)
    con: dict[Hashable, list[Hashable]] = defaultdict(list)
    for p, h, y in zip(premises, hypotheses, labels):
        if y == ENTAILMENT:
            ent[p].append(h)
        elif y == CONTRADICTION:
            con[p].append(h)
    rows = []
    for premise, positives in ent.items():
        negatives = con.get(premise)
        if not negatives:
            continue
        if every_combination:
            rows.extend((premise, j, k) for j in positives for k in negatives if j != k)
        else:
            rows.extend((premise, j, negatives[i % len(negatives)]) for i, j in enumerate(positives))
    return rows


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
            f"{NO_TRIPLETS}: every group is a singleton or all {n} sentences share one group"
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
        raise ValueError(f"{NO_TRIPLETS}: no pair is scored >= threshold={threshold}")
    return torch.tensor(rows, dtype=torch.long)
