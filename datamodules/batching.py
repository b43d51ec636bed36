"""Batch construction shared by every DataModule: padding collate and the batch sampler."""
from __future__ import annotations

import random
from collections import deque
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import Sampler


class PadCollator:
    """Pads pre-tokenized columns into ``{column: {"input_ids", "attention_mask"}}`` (B, L) tensors.

    ``text_columns`` are tokenized columns stored as ``<column>_ids``; ``label_columns`` are
    copied into tensors (integer labels as long, scores as float).
    """

    def __init__(self, text_columns: Sequence[str], pad_token_id: int, label_columns: Sequence[str] = ()) -> None:
        self.text_columns = list(text_columns)
        self.pad_token_id = pad_token_id
        self.label_columns = list(label_columns)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        for column in self.text_columns:
            seqs = [row[f"{column}_ids"] for row in rows]
            width = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), width), self.pad_token_id, dtype=torch.long)  # (B, L)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for i, s in enumerate(seqs):
                ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
                mask[i, : len(s)] = 1
            batch[column] = {"input_ids": ids, "attention_mask": mask}
        for column in self.label_columns:
            values = [row[column] for row in rows]
            dtype = torch.long if isinstance(values[0], int) else torch.float
            batch[column] = torch.tensor(values, dtype=dtype)
        return batch


class SentenceBatchSampler(Sampler[list[int]]):
    """Shuffled batches, optionally length-grouped and free of duplicate sentences, sharded by rank.

    Every rank builds the same sequence of *global* batches (``batch_size * num_replicas``
    examples, same seed and epoch) and takes its own slice, so per-device batches are equal in
    size and in-batch negatives can be gathered across devices.

    Args:
        lengths: token count of each example (for length grouping).
        batch_size: examples per device per step.
        shuffle: new random order every epoch (``set_epoch``).
        drop_last: drop the last incomplete global batch (needed by in-batch negatives); otherwise
            it is completed by wrapping around to the first examples when several ranks need equal shares.
        group_by_length: sort within random chunks of ``chunk_batches`` batches by length, then
            shuffle the batches: less padding, while the chunk's batches stay randomly composed.
        unique_keys: per-example hashable keys (e.g. its sentences); no two examples sharing a key
            land in one global batch, because a duplicate is a false in-batch negative.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
        group_by_length: bool = False,
        unique_keys: Sequence[Sequence[Any]] | None = None,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        chunk_batches: int = 50,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.group_by_length = group_by_length
        self.unique_keys = unique_keys
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.chunk_batches = chunk_batches
        self.epoch = 0
        self.skip_batches = 0  # set when resuming mid-epoch
        self._global_batches: list[list[int]] | None = None
        self._built_for_epoch = -1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        order = list(range(len(self.lengths)))
        rng = random.Random(self.seed + self.epoch)
        if self.shuffle:
            rng.shuffle(order)
        if self.group_by_length:
            chunk = self.batch_size * self.num_replicas * self.chunk_batches
            grouped = []
            for start in range(0, len(order), chunk):
                grouped.extend(sorted(order[start:start + chunk], key=lambda i: self.lengths[i]))
            order = grouped
        return order

    def _split(self, order: list[int], size: int) -> list[list[int]]:
        if self.unique_keys is None:
            return [order[i:i + size] for i in range(0, len(order), size)]
        batches, batch, seen, deferred = [], [], set(), deque()
        for idx in order:
            keys = set(self.unique_keys[idx])
            if keys & seen:
                deferred.append(idx)
                continue
            batch.append(idx)
            seen |= keys
            if len(batch) == size:
                batches.append(batch)
                batch, seen = [], set()
                for _ in range(len(deferred)):  # retry deferred examples once per new batch
                    cand = deferred.popleft()
                    cand_keys = set(self.unique_keys[cand])
                    if len(batch) < size and not cand_keys & seen:
                        batch.append(cand)
                        seen |= cand_keys
                    else:
                        deferred.append(cand)
                if len(batch) == size:
                    batches.append(batch)
                    batch, seen = [], set()
        rest = batch + list(deferred)  # duplicates that found no place: only in trailing batches
        batches.extend(rest[i:i + size] for i in range(0, len(rest), size))
        return batches

    def global_batches(self) -> list[list[int]]:
        if self._built_for_epoch != self.epoch or self._global_batches is None:
            size = self.batch_size * self.num_replicas
            batches = self._split(self._order(), size)
            if batches and len(batches[-1]) < size:
                if self.drop_last:
                    batches = batches[:-1]
                elif self.num_replicas > 1:  # every rank needs an equal share
                    pool = [i for b in batches for i in b]
                    need = size - len(batches[-1])
                    batches[-1] = batches[-1] + (pool * (need // len(pool) + 1))[:need]
            if self.shuffle and self.group_by_length:
                random.Random(self.seed + self.epoch + 1).shuffle(batches)
            self._global_batches = batches
            self._built_for_epoch = self.epoch
        return self._global_batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.global_batches()
        start, self.skip_batches = self.skip_batches, 0
        for batch in batches[start:]:
            if self.num_replicas == 1:
                yield batch
            else:
                share = len(batch) // self.num_replicas
                yield batch[self.rank * share:(self.rank + 1) * share]

    def __len__(self) -> int:
        return len(self.global_batches())
