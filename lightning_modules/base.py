"""What no objective owns: encoding, the shared STS validation, optimizer and warmup schedule."""
from __future__ import annotations

import warnings
from typing import Any, Callable, Literal, Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import SpearmanCorrCoef
from transformers import get_scheduler

from encoders.sentence import SentenceEncoder

from .grad_cache import embed_columns
from .losses import alignment, matryoshka_loss, uniformity


class SentenceEmbeddingModule(L.LightningModule):
    """Base of every objective. A subclass implements ``training_loss(batch) -> (loss, logs)`` and
    declares its side of the data contract, which the DataModule checks in ``setup`` before any work:
    ``batch_keys`` (the training batch keys it reads) and ``needs_unique_sentences`` (no sentence twice
    in a batch, for in-batch negatives; the DataModule's sampler then guarantees it).

    An objective whose loss is a function of the embeddings alone computes it through
    ``embedding_loss(columns, loss_fn)`` and sets ``supports_matryoshka``: that one method embeds the
    columns (through GradCache when asked) and, with ``matryoshka_dims``, sums the loss over the
    truncated embeddings (``losses.matryoshka_loss``; Kusupati et al. 2022), each dimension's loss
    logged as ``train/loss_dim<d>``.

    Validation is the same for all objectives: Spearman x 100 of cosine similarity against the
    gold score on each dev set the DataModule provides (``val/stsb_spearman``,
    ``val/sickr_spearman``, their mean ``val/avg_spearman``), and Wang & Isola's alignment
    (over dev pairs whose gold score is at least ``alignment_threshold`` on the [0, 1] scale)
    and uniformity (over all dev sentences) of the first dev set.

    Args:
        encoder: the sentence encoder being trained (exported on its own after training).
        lr: peak learning rate.
        weight_decay: AdamW's decoupled weight decay, not applied to biases and LayerNorm weights
            (``optimizer: adam`` has none).
        warmup_ratio: fraction of all optimizer steps spent in linear warmup.
        scheduler: learning-rate shape after warmup (``transformers.get_scheduler`` names).
        alignment_threshold: rescaled gold score from which a dev pair counts as a positive pair.
        optimizer: ``adamw`` (sentence-transformers' choice, with ``weight_decay``) or ``adam``, the
            SBERT paper's Adam without weight decay.
        matryoshka_dims: train the first d dimensions of the embedding as embeddings of their own, for each
            d given (e.g. ``[384, 256, 128, 64]``): the loss is summed over the truncations. None: the full
            embedding only.
        matryoshka_weights: one weight per ``matryoshka_dims`` entry (default 1 each).
        val_truncate_dim: score the dev sets during training on the first this many dimensions (cosine of
            the truncation); None: the full embedding.
    """

    batch_keys: tuple[str, ...] = ()
    needs_unique_sentences: bool = False
    supports_matryoshka: bool = False  # the loss goes through embedding_loss

    @classmethod
    def accepts_batch_keys(cls, keys: Sequence[str]) -> bool:
        """Whether training batches with these keys are enough for this objective."""
        return set(cls.batch_keys) <= set(keys)

    @classmethod
    def describe_batch_keys(cls) -> str:
        return ", ".join(cls.batch_keys)

    def __init__(
        self,
        encoder: SentenceEncoder,
        lr: float = 2e-5,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        scheduler: Literal["linear", "constant_with_warmup", "cosine"] = "linear",
        alignment_threshold: float = 0.8,
        optimizer: Literal["adamw", "adam"] = "adamw",
        matryoshka_dims: list[int] | None = None,
        matryoshka_weights: list[float] | None = None,
        val_truncate_dim: int | None = None,
    ) -> None:
        super().__init__()
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not 0 <= warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if optimizer not in ("adamw", "adam"):
            raise ValueError(f"optimizer must be 'adamw' or 'adam', got {optimizer!r}")
        self._check_matryoshka(encoder, matryoshka_dims, matryoshka_weights, val_truncate_dim)
        self.save_hyperparameters(ignore=["encoder"])
        self.encoder = encoder
        self.matryoshka_dims = list(matryoshka_dims) if matryoshka_dims else None
        self.matryoshka_weights = list(matryoshka_weights) if matryoshka_weights else None
        self.val_truncate_dim = val_truncate_dim
        self._loss_parts: dict[int, Tensor] = {}  # each Matryoshka dimension's loss of the last batch
        self.run_config: str | None = None  # the resolved CLI config, stored in every checkpoint
        self.val_spearman = nn.ModuleDict()
        self.val_names: list[str] = []
        self._val_parts: dict[int, list[tuple[Tensor, Tensor]]] = {}  # dev set -> (rows, embeddings) per batch
        self._train_keys: set[str] = set()  # every train/ scalar logged so far (training_step's guard)
        self._train_keys_warned: set[str] = set()

    def _check_matryoshka(self, encoder: Any, dims: list[int] | None, weights: list[float] | None,
                          val_dim: int | None) -> None:
        width = getattr(encoder, "dim", None)
        if dims is not None:
            if not type(self).supports_matryoshka:
                raise ValueError(f"model.init_args.matryoshka_dims: {type(self).__name__}'s loss is not a function of "
                                 "the embeddings alone; the objectives that take it: MNR, SimCSE, DCLR, Triplet, "
                                 "STSRegression")
            if not dims:
                raise ValueError("model.init_args.matryoshka_dims: give at least one dimension, or leave it unset")
            for d in dims:
                if not isinstance(d, int) or d < 1 or (width is not None and d > width):
                    raise ValueError(f"model.init_args.matryoshka_dims: {d!r} is not a dimension of the encoder's "
                                     f"{width}-dimensional embeddings (1 to {width})")
            if len(set(dims)) != len(dims):
                raise ValueError(f"model.init_args.matryoshka_dims: {dims} repeats a dimension")
        if weights is not None:
            if dims is None or len(weights) != len(dims):
                raise ValueError(f"model.init_args.matryoshka_weights: {len(weights)} weights for "
                                 f"{len(dims or [])} matryoshka_dims; give one weight per dimension")
            if any(not w > 0 for w in weights):
                raise ValueError(f"model.init_args.matryoshka_weights: {weights}: every weight must be > 0")
        if val_dim is not None and (val_dim < 1 or (width is not None and val_dim > width)):
            raise ValueError(f"model.init_args.val_truncate_dim: {val_dim} is not a dimension of the encoder's "
                             f"{width}-dimensional embeddings (1 to {width})")

    def embedding_loss(self, columns: list[Any], loss_fn: Callable[[list[Tensor]], Tensor],
                       mini_batch_size: int | None = None) -> Tensor:
        """``loss_fn`` over the encoder's embeddings of each column (tokenized features), through GradCache
        when ``mini_batch_size`` is set, and summed over the truncations when ``matryoshka_dims`` is set."""
        return embed_columns(self.encoder, columns, self.matryoshka(loss_fn), mini_batch_size)

    def matryoshka(self, loss_fn: Callable[[list[Tensor]], Tensor]) -> Callable[[list[Tensor]], Tensor]:
        """``loss_fn`` itself, or with ``matryoshka_dims`` its weighted sum over the truncated embeddings
        (``losses.matryoshka_loss``). It then runs once per dimension, widest last, so the scalars it leaves
        for the log describe the widest truncation; each dimension's loss is logged as ``train/loss_dim<d>``."""
        if self.matryoshka_dims is None:
            return loss_fn
        order = sorted(range(len(self.matryoshka_dims)), key=lambda i: self.matryoshka_dims[i])  # widest last
        dims = [self.matryoshka_dims[i] for i in order]
        weights = [self.matryoshka_weights[i] for i in order] if self.matryoshka_weights else None

        def summed(embeddings: list[Tensor]) -> Tensor:
            loss, self._loss_parts = matryoshka_loss(loss_fn, embeddings, dims, weights)
            return loss

        return summed

    # -- what objectives implement ------------------------------------------------------
    def training_loss(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """The objective's loss on one batch and extra scalars to log under ``train/``."""
        raise NotImplementedError

    def frozen_modules(self) -> list[nn.Module]:
        """Modules that never train (kept in eval mode with requires_grad off)."""
        return []

    # -- training --------------------------------------------------------------------------
    def forward(self, features: dict[str, Tensor]) -> Tensor:
        return self.encoder(features)

    def encode(self, sentences: list[str], **kwargs) -> Tensor:
        return self.encoder.encode(sentences, **kwargs)

    def on_train_epoch_start(self) -> None:
        # from_pretrained left the transformer in eval mode and Lightning preserves modes:
        # without this, dropout would be off and SimCSE's two views identical.
        self.train()
        for module in self.frozen_modules():
            module.eval()
            module.requires_grad_(False)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        loss, logs = self.training_loss(batch)
        size = self._batch_size(batch)
        scalars = {"train/loss": loss, **{f"train/{name}": value for name, value in logs.items()},
                   **{f"train/loss_dim{dim}": value for dim, value in self._loss_parts.items()},
                   "train/lr": self.trainer.optimizers[0].param_groups[0]["lr"]}
        self._check_every_step(scalars)
        for name, value in scalars.items():
            self.log(name, value, prog_bar=name == "train/loss", batch_size=size)
        return loss

    def _check_every_step(self, scalars: dict[str, Any]) -> None:
        """Warns, once per name, of a training scalar that an earlier step logged and this one does not.
        Lightning keeps a step's value until the epoch ends and writes it again at every later logged step,
        so the logs would show a value this step never had, and a mean over logged steps would repeat it.
        Log such a figure at every step, or as a whole-run figure (DCLR's ``mask_tally``)."""
        for name in sorted(self._train_keys - scalars.keys() - self._train_keys_warned):
            warnings.warn(f"{type(self).__name__} logged {name} at an earlier training step but not at step "
                          f"{self.global_step}: Lightning writes its last value again at the later logged steps; "
                          "log it at every step, or as a whole-run figure", stacklevel=2)
            self._train_keys_warned.add(name)
        self._train_keys |= scalars.keys()

    @staticmethod
    def _batch_size(batch: dict[str, Any]) -> int:
        for value in batch.values():
            if isinstance(value, dict):
                return int(value["input_ids"].shape[0])
        return 1

    # -- validation -------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        names = list(getattr(datamodule, "val_names", []))
        if names != self.val_names:
            self.val_names = names
            with warnings.catch_warnings():
                # Spearman needs every score in its buffer, which is what the warning is about; a dev set
                # is a few thousand pairs.
                warnings.filterwarnings("ignore", message="Metric `SpearmanCorrcoef` will save all targets")
                self.val_spearman = nn.ModuleDict(
                    {n: SpearmanCorrCoef(sync_on_compute=False) for n in names}  # each rank sees the full dev set
                ).to(self.device)

    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        """One batch of a dev set's distinct sentences (``datamodules.scored.DevSet``): their embeddings,
        kept until the epoch's end, where the pairs are scored."""
        emb = self.encoder(batch["sentence"]).float()  # (B, H)
        if self.val_truncate_dim is not None:
            emb = emb[:, :self.val_truncate_dim]  # (B, d): the cosine below renormalises it
        self._val_parts.setdefault(dataloader_idx, []).append((batch["rows"].to(emb.device), emb))

    def on_validation_epoch_end(self) -> None:
        parts, self._val_parts = self._val_parts, {}
        if not self.val_names:
            return
        dev_sets = self.trainer.datamodule.dev_sets
        values = []
        for k, name in enumerate(self.val_names):
            u, v, score = self._dev_pairs(dev_sets[name], parts.get(k, []))
            if score.numel() < 2:
                continue  # a sanity check's few batches hold no scored pair
            metric = self.val_spearman[name]
            metric.update(F.cosine_similarity(u, v, dim=-1), score)  # (N,)
            rho = metric.compute() * 100
            metric.reset()
            values.append(rho)
            self.log(f"val/{name}_spearman", rho, prog_bar=name == "stsb")
            if k == 0:
                u, v = F.normalize(u, dim=-1), F.normalize(v, dim=-1)
                positive = score >= self.hparams.alignment_threshold
                if positive.any():
                    self.log("val/alignment", alignment(u[positive], v[positive]))
                self.log("val/uniformity", uniformity(torch.cat([u, v])))
        if len(values) == len(self.val_names):
            self.log("val/avg_spearman", torch.stack(values).mean())

    @staticmethod
    def _dev_pairs(dev, parts: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
        """The embeddings of each pair's two sentences (N, H) and its gold score (N,), for the pairs whose
        sentences were both encoded (all of them, except in a sanity check)."""
        if not parts:
            return torch.empty(0, 1), torch.empty(0, 1), torch.empty(0)
        rows = torch.cat([r for r, _ in parts])  # (D,)
        emb = torch.cat([e for _, e in parts])  # (D, H)
        matrix = emb.new_zeros(len(dev.sentences), emb.shape[1])  # (S, H), row = the DevSet's sentence row
        matrix[rows] = emb
        seen = torch.zeros(len(dev.sentences), dtype=torch.bool, device=emb.device)
        seen[rows] = True
        pairs = dev.pairs.to(emb.device)  # (N, 2)
        keep = seen[pairs[:, 0]] & seen[pairs[:, 1]]  # (N,)
        pairs = pairs[keep]
        return matrix[pairs[:, 0]], matrix[pairs[:, 1]], dev.scores.to(emb.device)[keep]

    # -- optimisation -----------------------------------------------------------------------
    def trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        frozen = {id(p) for m in self.frozen_modules() for p in m.parameters()}
        return [(n, p) for n, p in self.named_parameters() if p.requires_grad and id(p) not in frozen]

    def configure_optimizers(self):
        no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
        named = self.trainable_parameters()
        groups = [
            {"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": self.hparams.weight_decay},
            {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0},
        ]
        # The fused kernel updates all parameters in one pass; on CPU the default is a per-tensor
        # loop, which docs/PERFORMANCE.md measured at several times the fused step's cost.
        fused = all(p.device.type in ("cpu", "cuda") for _, p in named)
        if self.hparams.get("optimizer", "adamw") == "adam":
            groups = [{"params": [p for _, p in named], "weight_decay": 0.0}]
            optimizer = torch.optim.Adam(groups, lr=self.hparams.lr, fused=fused or None)
        else:
            optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=self.hparams.lr, fused=fused or None)
        total = int(self.trainer.estimated_stepping_batches)
        scheduler = get_scheduler(
            self.hparams.scheduler, optimizer, num_warmup_steps=int(self.hparams.warmup_ratio * total),
            num_training_steps=total,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """``trainer.gradient_clip_val`` with the fused optimizer. Lightning's mixed-precision plugin refuses
        to clip for an optimizer that unscales gradients itself (fused), a guard for fp16's grad scaler; bf16
        and fp32 have no scaler, so the gradients are clipped here, as Lightning would clip them otherwise."""
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if gradient_clip_val is None or scaler is not None:
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm in (None, "norm"):
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)

    # -- checkpoints ------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Enough to rebuild and evaluate the encoder from the checkpoint alone.
        checkpoint["encoder_config"] = dict(self.encoder.config_dict)
        checkpoint["encoder_class"] = type(self.encoder).__name__  # encoders.checkpoint.encoder_classes
        checkpoint["objective"] = f"{type(self).__module__}.{type(self).__qualname__}"
        if self.run_config is not None:
            checkpoint["run_config"] = self.run_config
