"""Duplicate-free batching at scale: Arrow sentence ids and the sampler's grouped deferral."""
from __future__ import annotations

import random
import time
from collections import deque

import datasets
import numpy as np
import pytest

from datamodules.batching import SentenceBatchSampler
from datamodules.io import sentence_ids, token_counts


def naive_split(keys, order, size):
    """The straightforward algorithm: defer a colliding example, retry every deferred one after each batch."""
    batches, batch, seen, deferred = [], [], set(), deque()
    for idx in order:
        if set(keys[idx]) & seen:
            deferred.append(idx)
            continue
        batch.append(idx)
        seen |= set(keys[idx])
        if len(batch) == size:
            batches.append(batch)
            batch, seen = [], set()
            for _ in range(len(deferred)):
                cand = deferred.popleft()
                if len(batch) < size and not set(keys[cand]) & seen:
                    batch.append(cand)
                    seen |= set(keys[cand])
                else:
                    deferred.append(cand)
            if len(batch) == size:
                batches.append(batch)
                batch, seen = [], set()
    rest = batch + list(deferred)
    return batches + [rest[i:i + size] for i in range(0, len(rest), size)]


def test_sentence_ids_are_shared_across_columns_and_respect_selection():
    ds = datasets.Dataset.from_dict({"anchor": ["a", "b", "c", "a"], "positive": ["b", "x", "a", "y"]})
    ids = sentence_ids(ds, ["anchor", "positive"])
    assert ids.shape == (4, 2)
    assert ids[0, 0] == ids[2, 1] == ids[3, 0] and ids[0, 1] == ids[1, 0]  # "a" and "b" wherever they are
    assert len({ids[1, 1], ids[2, 0], ids[3, 1], ids[0, 0], ids[0, 1]}) == 5
    picked = sentence_ids(ds.select([3, 1]), ["anchor"])
    assert picked[:, 0].tolist()[0] != picked[:, 0].tolist()[1]


def test_token_counts():
    ds = datasets.Dataset.from_dict({"ids": [[1, 2, 3], [4], [5, 6]]})
    assert token_counts(ds, "ids") == [3, 1, 2]
    assert token_counts(ds.select([2, 0]), "ids") == [2, 3]


@pytest.mark.parametrize("vocab, k, size", [(4, 1, 2), (30, 2, 8), (400, 2, 16), (10**6, 3, 5), (7, 3, 3)])
def test_sampler_matches_the_naive_algorithm(vocab, k, size):
    rng = random.Random(vocab + k)
    n = 1500
    keys = [tuple(f"s{rng.randrange(vocab)}" for _ in range(k)) for _ in range(n)]
    ids = {}
    codes = np.array([[ids.setdefault(x, len(ids)) for x in row] for row in keys], dtype=np.int64)
    order = list(range(n))
    rng.shuffle(order)
    expected = naive_split(keys, order, size)
    for unique_keys in (keys, codes):
        assert SentenceBatchSampler([0] * n, size, unique_keys=unique_keys)._split(order, size) == expected


def test_many_copies_of_one_sentence_stay_linear():
    n, size = 100_000, 64
    codes = np.arange(n, dtype=np.int64).reshape(-1, 1)
    codes[32::33] = 0  # one sentence ~3000 times: the naive retry loop rescans every copy per batch
    sampler = SentenceBatchSampler([0] * n, size, drop_last=True, unique_keys=codes)
    start = time.process_time()
    batches = sampler.global_batches()
    assert time.process_time() - start < 5  # ~0.1 s; the quadratic loop needs minutes at 1M rows
    copies = int((codes[:, 0] == 0).sum())
    with_duplicates = sum(int((codes[b, 0] == 0).sum()) > 1 for b in batches)
    assert with_duplicates <= copies // size + 1  # leftover copies only in the trailing batches
