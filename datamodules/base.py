"""What every DataModule shares: tokenization in the data pipeline, batching, STS validation sets."""
from __future__ import annotations

import hashlib
import logging
import os
from typing import Any, Sequence

import datasets
import lightning as L
import torch
from torch.utils.data import DataLoader

from encoders.padding import pad_token_ids

from .batching import PadCollator, SentenceBatchSampler
from .io import DataError, fetch_hub_file, is_hub_file, quiet_progress, token_counts
from encoders.paths import data_path
from .scored import DevSet, load_sts_pairs

log = logging.getLogger(__name__)


class SentenceDataModule(L.LightningDataModule):
    """Base of every DataModule: subclasses say what the training rows are, this class
    tokenizes them once (cached by ``datasets``, keyed on the tokenizer and max length),
    batches them, and provides the STS validation sets every objective is selected on.

    The tokenizer and truncation lengths are the model's: ``train.py``'s CLI passes the encoder's
    (``use_tokenizer``), so they are set in one place only. In ``setup``, before loading anything,
    the objective's side of the contract is checked (``check_objective``): its ``batch_keys`` must be
    among this module's, and when it ``needs_unique_sentences`` the sampler never puts a sentence twice
    in a batch (and drops the last incomplete batch).

    Args:
        per_device_batch_size: examples per device per optimizer step (the global batch is this
            times the number of devices; gradient accumulation does not add in-batch negatives).
        eval_batch_size: batch size for validation encoding.
        sts_dir: directory with ``stsb.dev.tsv`` (and optionally ``sickr.dev.tsv``) for validation.
        val_sources: validation sets, name -> source (hub split or file); ``sts_dir`` overrides
            the names it provides (``stsb``, ``sickr``), so a local run can replace the hub's.
        group_by_length: length-grouped ("smart") batching, shuffled across groups.
        num_workers: DataLoader worker processes.
        seed: seed of the batch order. None (the default): the run's seed, ``seed_everything``
            (which Lightning exports as ``PL_GLOBAL_SEED``; 42 when no seed was set), so runs with
            different seeds see different batch orders, as in sentence-transformers and SimCSE.
        neighbour_batches: a model (hub name, folder or ``*.ckpt``) whose embeddings of the training rows'
            first text column group each row with its nearest neighbours (``datamodules.neighbours``); the
            batches are then made of whole groups, so they hold near neighbours (in-batch false negatives).
            None: batches of random rows.
        neighbour_group_size: rows per neighbour group (a batch holds ``per_device_batch_size /`` this many).
    """

    text_columns: Sequence[str] = ()
    label_columns: Sequence[str] = ()

    def __init__(
        self,
        per_device_batch_size: int = 16,
        eval_batch_size: int = 64,
        sts_dir: str | None = None,
        val_sources: dict[str, str] | None = None,
        group_by_length: bool = False,
        num_workers: int = 0,
        seed: int | None = None,
        neighbour_batches: str | None = None,
        neighbour_group_size: int = 8,
    ) -> None:
        super().__init__()
        if neighbour_batches is not None and group_by_length:
            raise ValueError("data.init_args.neighbour_batches and group_by_length both decide the batches; choose one")
        if neighbour_group_size < 1:
            raise ValueError(f"data.init_args.neighbour_group_size must be positive, got {neighbour_group_size}")
        if per_device_batch_size < 1:
            raise ValueError(f"per_device_batch_size must be positive, got {per_device_batch_size}")
        self.per_device_batch_size = per_device_batch_size
        self.eval_batch_size = eval_batch_size
        self.sts_dir = sts_dir
        self.val_sources = dict(val_sources or {})
        self.group_by_length = group_by_length
        self.num_workers = num_workers
        self.seed = seed
        self.neighbour_batches = neighbour_batches
        self.neighbour_group_size = neighbour_group_size
        self.tokenizer = None
        self.max_length: int | None = None
        self.eval_max_length: int | None = None
        self.pad_to_multiple_of = 1
        self.unique_sentences = False  # set from the objective (check_objective)
        self.train_dataset: datasets.Dataset | None = None
        self.dev_sets: dict[str, DevSet] = {}
        self._dev_ids: dict[str, list[list[int]]] = {}  # each dev set's distinct sentences, tokenized
        self.train_sampler: SentenceBatchSampler | None = None
        self._resumed_position = False

    # -- what subclasses provide -------------------------------------------------------------
    def load_train_rows(self) -> datasets.Dataset:
        """The training rows with the subclass's text (and label) columns, validated."""
        raise NotImplementedError

    def unique_keys(self, ds: datasets.Dataset) -> Sequence[Sequence[Any]] | None:
        """Keys that must not repeat inside a batch (in-batch negatives), e.g. ``io.sentence_ids``'
        (N, k) integer array; None = no constraint."""
        return None

    @property
    def batch_keys(self) -> tuple[str, ...]:
        """The keys of a training batch: this module's side of the data contract."""
        return (*self.text_columns, *self.label_columns)

    # -- wiring: the model's tokenizer, and the objective's contract ------------------------
    def use_tokenizer(self, tokenizer: Any, max_length: int, eval_max_length: int, pad_to_multiple_of: int = 1) -> None:
        """Tokenize with the model's tokenizer: training rows truncated at ``max_length``, dev pairs at
        ``eval_max_length`` (the model's maximum), batch widths rounded up to a multiple of
        ``pad_to_multiple_of`` (a compiled encoder's shape buckets). ``SentenceEncoder.tokenization()``
        gives them all."""
        self.tokenizer, self.max_length, self.eval_max_length = tokenizer, max_length, eval_max_length
        self.pad_to_multiple_of = pad_to_multiple_of

    def check_objective(self, objective: Any) -> None:
        """Fail, naming both classes, when ``objective`` cannot train on this module's batches; take its
        need for batches without a repeated sentence (in-batch negatives)."""
        accepts = getattr(objective, "accepts_batch_keys", None)
        if accepts is None:
            return
        name = objective.__name__ if isinstance(objective, type) else type(objective).__name__
        if not accepts(self.batch_keys):
            raise ValueError(
                f"{name} trains on batch keys {objective.describe_batch_keys()}, but "
                f"{type(self).__name__} gives {', '.join(self.batch_keys) or 'none'}; choose a data module or view "
                "that provides them"
            )
        self.unique_sentences = bool(getattr(objective, "needs_unique_sentences", False))

    def _require_tokenizer(self):
        if self.tokenizer is None:
            raise RuntimeError(f"{type(self).__name__}.use_tokenizer(**encoder.tokenization()) before setup() "
                               "(train.py's CLI does it)")
        return self.tokenizer

    def validation_sources(self) -> dict[str, str]:
        sources: dict[str, str] = dict(self.val_sources)  # data.sts_dir, when given, wins per name
        if self.sts_dir is not None:
            sts_dir = data_path(self.sts_dir)
            stsb = os.path.join(sts_dir, "stsb.dev.tsv")
            if not os.path.isfile(stsb):
                raise DataError(f"{stsb}: data file not found (data.sts_dir must hold stsb.dev.tsv)")
            sources["stsb"] = stsb
            sick = os.path.join(sts_dir, "sickr.dev.tsv")
            if os.path.isfile(sick):
                sources["sickr"] = sick
        return sources

    def tokenize(self, ds: datasets.Dataset, columns: Sequence[str], max_length: int) -> datasets.Dataset:
        """Add ``<column>_ids`` token ids (no padding) for each text column: batched tokenizer calls that
        return the ids only, written as Arrow and cached by ``datasets``; a large set is split over the
        CPU cores this process may use (100k rows or more, one process per core, at most 8)."""
        tokenizer = self._require_tokenizer()
        key = "|".join([ds._fingerprint, tokenizer.name_or_path, str(len(tokenizer)), str(max_length), *columns])
        fingerprint = hashlib.sha256(key.encode()).hexdigest()[:32]

        def encode(batch: dict[str, list]) -> dict[str, list]:
            # No attention mask or token types: padding makes the mask, and building Python lists of
            # values nobody reads cost as much as the ids themselves.
            return {
                f"{c}_ids": tokenizer(batch[c], truncation=True, max_length=max_length, return_attention_mask=False,
                                      return_token_type_ids=False)["input_ids"]
                for c in columns
            }

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        # Below 100k rows, starting processes and merging their files costs more than it saves.
        num_proc = min(cores, 8) if cores > 1 and len(ds) >= 100_000 else None
        with quiet_progress():
            return ds.map(encode, batched=True, batch_size=2000, new_fingerprint=fingerprint, num_proc=num_proc,
                          desc="tokenizing")

    def sources(self) -> list[str]:
        """Every source this module reads: its training source(s) (``train_source`` or ``train_sources``)
        and its validation sets."""
        train = getattr(self, "train_sources", None) or [getattr(self, "train_source", None)]
        return [s for s in [*train, *self.validation_sources().values()] if s]

    def prepare_data(self) -> None:
        """Download the ``hf://datasets/...`` files among the sources into the Hugging Face cache, once
        per machine (Lightning calls this on local rank 0 only); ``setup`` then reads them from the cache.
        Hub splits (``name:split``) are left to ``datasets`` in ``setup``, which caches them itself."""
        for source in dict.fromkeys(self.sources()):
            if is_hub_file(source):
                fetch_hub_file(source)

    def setup(self, stage: str | None = None) -> None:
        if self.trainer is not None and self.trainer.lightning_module is not None:
            self.check_objective(self.trainer.lightning_module)  # before any work
        self._require_tokenizer()
        if stage in (None, "fit") and self.train_dataset is None:
            rows = self.load_train_rows()
            if len(rows) == 0:
                raise DataError(f"{type(self).__name__}: no training rows were loaded")
            keys = self.unique_keys(rows)
            self.train_dataset = self.tokenize(rows, self.text_columns, self.max_length)
            first = f"{self.text_columns[0]}_ids"
            lengths = token_counts(self.train_dataset, first) if self.group_by_length else [0] * len(rows)
            world, rank = self._world()
            if self.unique_sentences and self.per_device_batch_size * world < 2:
                raise ValueError("data.per_device_batch_size: in-batch negatives need a global batch of at least 2")
            groups = self._neighbour_groups(rows) if self.neighbour_batches is not None else None
            self.train_sampler = SentenceBatchSampler(
                lengths, self.per_device_batch_size, shuffle=True, drop_last=self.unique_sentences,
                group_by_length=self.group_by_length, unique_keys=keys, seed=self.batch_seed,
                num_replicas=world, rank=rank, groups=groups,
            )
            if len(self.train_sampler) == 0:
                raise DataError(
                    f"{type(self).__name__}: {len(rows)} training rows make no full batch of "
                    f"{self.per_device_batch_size} x {world} devices"
                )
        if stage in (None, "fit", "validate") and not self.dev_sets:
            tokenizer = self._require_tokenizer()
            for name, source in self.validation_sources().items():
                dev = DevSet.from_pairs(load_sts_pairs(source))
                self.dev_sets[name] = dev
                self._dev_ids[name] = tokenizer(dev.sentences, truncation=True, max_length=self.eval_max_length,
                                                return_attention_mask=False, return_token_type_ids=False)["input_ids"]

    def _neighbour_groups(self, rows: datasets.Dataset) -> list[list[int]]:
        """Groups of each row and its nearest neighbours under ``neighbour_batches``'s embeddings of the first
        text column (the same groups on every rank and every resume: the model and seed decide them)."""
        import encoders

        from .neighbours import neighbour_groups

        model = encoders.load(self.neighbour_batches)
        column = self.text_columns[0]
        embeddings = model.encode(list(rows[column]), batch_size=self.eval_batch_size)  # (N, H)
        groups = neighbour_groups(embeddings, self.neighbour_group_size, self.batch_seed)
        log.info("neighbour batches: %d groups of %d rows by %s's embeddings of %s", len(groups),
                 self.neighbour_group_size, self.neighbour_batches, column)
        return groups

    def _world(self) -> tuple[int, int]:
        if self.trainer is not None:
            return self.trainer.world_size, self.trainer.global_rank
        return 1, 0

    @property
    def val_names(self) -> list[str]:
        return list(self.dev_sets)

    def _collator(self, text_columns: Sequence[str], label_columns: Sequence[str]) -> PadCollator:
        return PadCollator(text_columns, self._require_tokenizer().pad_token_id or 0, label_columns,
                           self.pad_to_multiple_of)

    def train_dataloader(self) -> DataLoader:
        if self._resumed_position:
            # A checkpoint's position was restored (load_state_dict); Lightning may ask for the
            # loader before it restores its own epoch counter, so the sampler's epoch wins once.
            self._resumed_position = False
        elif self.trainer is not None:
            self.train_sampler.set_epoch(self.trainer.current_epoch)
        columns = [f"{c}_ids" for c in self.text_columns] + list(self.label_columns)
        return DataLoader(
            self.train_dataset.select_columns(columns), batch_sampler=self.train_sampler,
            collate_fn=self._collator(self.text_columns, self.label_columns), num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0, generator=self._loader_generator(),
        )

    def _loader_generator(self) -> torch.Generator:
        # Each DataLoader iterator draws a worker seed; from its own generator, that draw leaves the
        # global RNG (dropout, noise) alone, so validating or resuming does not shift it.
        return torch.Generator().manual_seed(self.batch_seed)

    @property
    def batch_seed(self) -> int:
        """``seed``, or the run's seed when ``seed`` is None (read when the data is set up)."""
        return self.seed if self.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 42))

    # -- resuming mid-epoch: Lightning stores this state in every checkpoint -------------------
    def state_dict(self) -> dict[str, Any]:
        if self.train_sampler is None:
            return {}
        done = None
        trainer = self.trainer
        if trainer is not None and trainer.state.fn == "fit":
            # The loader reads ahead of training (Lightning prefetches a batch, workers more): the
            # epoch continues after the batches training has finished, never after those merely
            # fetched. The sampler's own count bounds it when a new epoch has begun but not its loop.
            finished = trainer.fit_loop.epoch_loop.batch_progress.current.processed
            done = min(finished, self.train_sampler.batches_yielded)
        return {"train_sampler": self.train_sampler.state_dict(batches_done=done)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "train_sampler" in state_dict and self.train_sampler is not None:
            self.train_sampler.load_state_dict(state_dict["train_sampler"])
            self._resumed_position = True

    def val_dataloader(self) -> list[DataLoader]:
        # Every rank sees the whole dev set (no distributed sampler, whose padding repeats
        # examples): the Spearman figures are exact and identical on all ranks. Each distinct sentence
        # is encoded once, in batches of similar length, as the STS evaluation encodes its tasks.
        pad_id = self._require_tokenizer().pad_token_id or 0
        # Its own generator: an iterator draws a seed, which must not come from the global RNG (dropout, noise).
        return [DataLoader(DevBatches(self._dev_ids[name], self.eval_batch_size, pad_id, self.pad_to_multiple_of),
                           batch_size=None, num_workers=self.num_workers, generator=self._loader_generator())
                for name in self.dev_sets]


class DevBatches(torch.utils.data.Dataset):
    """A dev set's distinct sentences in batches of similar token count, longest first:
    ``{"sentence": {"input_ids", "attention_mask"} (B, L), "rows": (B,) their rows in the DevSet}``."""

    def __init__(self, ids: list[list[int]], batch_size: int, pad_id: int, multiple: int = 1) -> None:
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        self.batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        self.ids, self.pad_id, self.multiple = ids, pad_id, multiple

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, k: int) -> dict[str, Any]:
        rows = self.batches[k]
        return {"sentence": pad_token_ids([self.ids[i] for i in rows], self.pad_id, self.multiple),
                "rows": torch.tensor(rows, dtype=torch.long)}
