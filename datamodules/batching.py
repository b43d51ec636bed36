"""Batch construction shared by every DataModule: padding collate and the batch sampler."""
from __future__ import annotations

import logging
import random
from collections import Counter, deque
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from encoders.padding import pad_token_ids

log = logging.getLogger(__name__)


class PadCollator:
    """Pads pre-tokenized columns into ``{column: {"input_ids", "attention_mask"}}`` (B, L) tensors.

    ``text_columns`` are tokenized columns stored as ``<column>_ids``; ``label_columns`` are
    copied into tensors (integer labels as long, scores as float); widths are rounded up to a
    multiple of ``pad_to_multiple_of``.
    """

    def __init__(self, text_columns: Sequence[str], pad_token_id: int, label_columns: Sequence[str] = (),
                 pad_to_multiple_of: int = 1) -> None:
        self.text_columns = list(text_columns)
        self.pad_token_id = pad_token_id
        self.label_columns = list(label_columns)
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        for column in self.text_columns:
            batch[column] = pad_token_ids([row[f"{column}_ids"] for row in rows], self.pad_token_id,
                                          self.pad_to_multiple_of)
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
        group_by_length: sort within random chunks of ``GROUP_CHUNK_BATCHES`` batches by length, then
            shuffle the batches: less padding, while the chunk's batches stay randomly composed.
        unique_keys: per-example hashable keys (e.g. its sentences), or an (N, k) integer array of
            them (``io.sentence_ids``); no two examples sharing a key land in one global batch,
            because a duplicate is a false in-batch negative.
        groups: examples that go into batches together (``datamodules.neighbours``): every epoch the
            groups are shuffled (their order, not their members) and dealt in turn, so a batch a multiple
            of the group size holds whole groups. Not combined with ``group_by_length``.
    """

    GROUP_CHUNK_BATCHES = 50  # length grouping sorts within chunks of this many global batches

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
        group_by_length: bool = False,
        unique_keys: Sequence[Sequence[Any]] | np.ndarray | None = None,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        groups: Sequence[Sequence[int]] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if groups is not None and group_by_length:
            raise ValueError("neighbour batches and group_by_length both decide the batches; choose one")
        self.groups = [list(g) for g in groups] if groups is not None else None
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.group_by_length = group_by_length
        self.unique_keys = unique_keys
        self._shared: list[bool] | None = None  # built on first use
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.skip_batches = 0  # set when resuming mid-epoch (load_state_dict)
        self.batches_yielded = 0  # of the current epoch, skipped ones included
        # The epoch's batches done, in this run's batches, when a resume re-expressed a position saved
        # with other batches (harness.exact_resume.ResumedEpochPosition hands it to Lightning's loop).
        self.resumed_batches_done: int | None = None
        # Examples of epoch ``_trained_epoch`` trained before a resume on another number of devices or
        # batch size: that epoch's rest is laid out in this run's batches, without them.
        self._trained: np.ndarray | None = None
        self._trained_epoch = -1
        self._global_batches: list[list[int]] | None = None
        self._built_for_epoch = -1

    @property
    def sampler(self) -> "SentenceBatchSampler":
        # Lightning calls set_epoch on ``loader.sampler`` and ``loader.batch_sampler.sampler`` at
        # each epoch start, never on the batch sampler itself: without this every epoch would
        # repeat the first one's order.
        return self

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.batches_yielded = 0
        self.epoch = epoch

    def _order(self) -> list[int]:
        rng = random.Random(self.seed + self.epoch)
        if self.groups is not None:  # whole groups, in a new order every epoch
            groups = list(self.groups)
            if self.shuffle:
                rng.shuffle(groups)
            return [i for g in groups for i in g]
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)
        if self.group_by_length:
            chunk = self.batch_size * self.num_replicas * self.GROUP_CHUNK_BATCHES
            grouped = []
            for start in range(0, len(order), chunk):
                grouped.extend(sorted(order[start:start + chunk], key=lambda i: self.lengths[i]))
            order = grouped
        return order

    def _split(self, order: list[int], size: int) -> list[list[int]]:
        if self.unique_keys is None:
            return [order[i:i + size] for i in range(0, len(order), size)]
        shared = self._shared_mask()
        keys = self.unique_keys
        as_ints = isinstance(keys, np.ndarray)
        keys_of = (lambda i: frozenset(keys[i].tolist())) if as_ints else (lambda i: frozenset(keys[i]))
        # An example whose keys no other example has can never collide: it skips the set work.
        # Deferred examples wait grouped by key set, each group in deferral order. When a batch is
        # full the next one first retries them in deferral order; within one group only the head
        # can be taken (once it is, the rest share its keys), so looking at group heads takes the
        # same examples as looking at every deferred one, without rescanning thousands of copies
        # of one sentence for every batch (that made the old loop quadratic).
        groups: dict[frozenset, deque] = {}
        waiting = 0  # deferral counter: the order among deferred examples
        batches, batch, seen = [], [], set()
        for idx in order:
            if shared[idx]:
                example_keys = keys_of(idx)
                if example_keys & seen:
                    groups.setdefault(example_keys, deque()).append((waiting, idx))
                    waiting += 1
                    continue
                seen |= example_keys
            batch.append(idx)
            if len(batch) == size:
                batches.append(batch)
                batch, seen = [], set()
                for _, group_keys in sorted((g[0][0], k) for k, g in groups.items()):  # retry, oldest first
                    if len(batch) == size:
                        break
                    if not group_keys & seen:
                        group = groups[group_keys]
                        batch.append(group.popleft()[1])
                        seen |= group_keys
                        if not group:
                            del groups[group_keys]
                if len(batch) == size:
                    batches.append(batch)
                    batch, seen = [], set()
        deferred = [idx for _, idx in sorted(x for g in groups.values() for x in g)]
        rest = batch + deferred  # duplicates that found no place: only in trailing batches
        batches.extend(rest[i:i + size] for i in range(0, len(rest), size))
        return batches

    def _shared_mask(self) -> list[bool]:
        """Per example: does another example (or the example itself, twice) have one of its keys."""
        if self._shared is None:
            keys = self.unique_keys
            if isinstance(keys, np.ndarray):  # (N, k) integer ids
                self._shared = (np.bincount(keys.ravel())[keys] > 1).any(axis=1).tolist()
            else:
                counts = Counter(k for row in keys for k in row)
                self._shared = [any(counts[k] > 1 for k in row) for row in keys]
        return self._shared

    def global_batches(self) -> list[list[int]]:
        if self._built_for_epoch != self.epoch or self._global_batches is None:
            trained = self._trained if self._trained_epoch == self.epoch else None
            self._global_batches = self._layout() if trained is None else self._rest_layout(trained)
            self._built_for_epoch = self.epoch
        return self._global_batches

    def _layout(self) -> list[list[int]]:
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
        return batches

    def _rest_layout(self, trained: np.ndarray) -> list[list[int]]:
        """The epoch's examples not in ``trained``, in the epoch's order, in this run's batches; in
        front, as many empty batches as make the epoch as long as an uninterrupted one (they count
        as done). The incomplete last batch is dropped with ``drop_last``; otherwise on several
        devices it is completed only to a multiple of the device count (fewer repeats than
        ``_layout``'s full batch): the rest of an epoch is seldom a whole number of batches."""
        size = self.batch_size * self.num_replicas
        rest = [i for i in self._order() if not trained[i]]
        batches = self._split(rest, size)
        if batches and len(batches[-1]) < size:
            if self.drop_last:
                batches = batches[:-1]
            elif len(batches[-1]) % self.num_replicas:
                need = self.num_replicas - len(batches[-1]) % self.num_replicas
                batches[-1] = batches[-1] + (rest * need)[:need]
        if self.shuffle and self.group_by_length:
            random.Random(self.seed + self.epoch + 1).shuffle(batches)
        return [[] for _ in range(max(0, len(self._layout()) - len(batches)))] + batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.global_batches()
        start, self.skip_batches = self.skip_batches, 0
        self.batches_yielded = start
        for batch in batches[start:]:
            self.batches_yielded += 1
            if self.num_replicas == 1:
                yield batch
            else:
                share = len(batch) // self.num_replicas
                yield batch[self.rank * share:(self.rank + 1) * share]

    def __len__(self) -> int:
        return len(self.global_batches())

    # -- resuming mid-epoch --------------------------------------------------------------------
    def state_dict(self, batches_done: int | None = None) -> dict[str, Any]:
        """Where the epoch stands: its number and how many of its batches are done.

        ``batches_done`` defaults to the batches yielded so far; a data loader reads ahead of
        training, so a caller that knows how many batches training has finished passes that.
        The rest identifies the batch order, to detect a resume with other data or settings, and
        (``trained``, after a resume on other settings) the examples of this epoch trained before
        its current layout began, packed eight to a byte.
        """
        state: dict[str, Any] = {
            "epoch": self.epoch, "batches_done": self.batches_yielded if batches_done is None else batches_done,
            "num_batches": len(self), "num_examples": len(self.lengths), "seed": self.seed,
            "num_replicas": self.num_replicas, "batch_size": self.batch_size}
        if self._trained is not None and self._trained_epoch == self.epoch:
            state["trained"] = torch.from_numpy(np.packbits(self._trained))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch after its finished batches: the next ``iter()`` yields the rest.

        The order is rebuilt from seed and epoch, so with the data, batch size, seed and number of
        devices of the saved run nothing is replayed or skipped. With the same data and seed on
        another number of devices or batch size, the saved run's batches are rebuilt to know which
        examples of the epoch it trained, and the epoch continues with the others, in the epoch's
        order and this run's batches (``_rest_layout``): none is seen twice or skipped, save the
        incomplete last batch's handling. With other data or seed the run continues from the same
        fraction of the epoch. Both warn (on rank 0: once per job).
        """
        self.set_epoch(int(state["epoch"]))
        done = int(state["batches_done"])
        self.resumed_batches_done = None
        self._trained, self._trained_epoch = None, -1
        saved_trained = state.get("trained")
        if saved_trained is not None:
            saved_trained = np.unpackbits(saved_trained.numpy(), count=len(self.lengths)).astype(bool)
        same_data = state.get("num_examples") == len(self.lengths) and state.get("seed") == self.seed
        same_batches = same_data and state.get("num_replicas") == self.num_replicas \
            and state.get("batch_size", self.batch_size) == self.batch_size  # older checkpoints lack it
        if same_batches and saved_trained is not None:  # a layout re-expressed by an earlier resume
            self._trained, self._trained_epoch = saved_trained, self.epoch
        self._built_for_epoch = -1
        if same_batches and state["num_batches"] == len(self):
            pass  # the saved run's own batches: continue after its finished ones
        elif same_data and not same_batches and "batch_size" in state:
            saved = SentenceBatchSampler(
                self.lengths, int(state["batch_size"]), shuffle=self.shuffle, drop_last=self.drop_last,
                group_by_length=self.group_by_length, unique_keys=self.unique_keys, seed=self.seed,
                num_replicas=int(state["num_replicas"]), groups=self.groups)
            saved._shared = self._shared
            saved.set_epoch(self.epoch)
            if saved_trained is not None:
                saved._trained, saved._trained_epoch = saved_trained, self.epoch
            trained = np.zeros(len(self.lengths), dtype=bool) if saved_trained is None else saved_trained.copy()
            for batch in saved.global_batches()[:done]:
                trained[batch] = True
            if done < len(saved):
                self._trained, self._trained_epoch = trained, self.epoch
                self._built_for_epoch = -1
                done = sum(1 for batch in self.global_batches() if not batch)
                then = f"epoch {self.epoch} continues with the {int((~trained).sum())} examples it has not trained on"
            else:
                done = len(self)  # the saved epoch is over (the next epoch starts below)
                then = f"epoch {self.epoch} was complete; epoch {self.epoch + 1} starts from its beginning"
            self.resumed_batches_done = done
            if self.rank == 0:
                log.warning(
                    "resuming on %d device(s) with %d examples per device and step; the checkpoint was saved on %s with "
                    "%s: %s, in this run's batches; steps and the learning-rate schedule continue from the "
                    "checkpoint's step", self.num_replicas, self.batch_size, state["num_replicas"], state["batch_size"],
                    then)
        else:
            if self.rank == 0:
                log.warning(
                    "resuming with other training data or settings (%d examples, seed %d, %d devices, %d batches "
                    "per epoch; the checkpoint had %s, %s, %s, %s): the batch order differs, so some examples of "
                    "this epoch may be seen twice or not at all", len(self.lengths), self.seed, self.num_replicas,
                    len(self), state.get("num_examples"), state.get("seed"), state.get("num_replicas"),
                    state["num_batches"])
            self._trained, self._trained_epoch = None, -1
            self._built_for_epoch = -1
            done = round(done * len(self) / max(1, state["num_batches"]))
            self.resumed_batches_done = min(done, len(self))
        if done >= len(self):  # saved after the epoch's last batch: the next epoch starts from its beginning
            self.set_epoch(self.epoch + 1)
            done = 0
        self.skip_batches = self.batches_yielded = done
