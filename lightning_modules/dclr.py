"""DCLR: debiased contrastive learning with noise negatives and instance weighting."""
from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor, nn

from encoders.augment import Augmentation, check_augmentation, positive_view
from encoders.sentence import Pooling, SentenceEncoder

from .base import SentenceEmbeddingModule
from .distributed import gather_with_grad, rank_and_world, sum_over_ranks
from .losses import (anchor_cosines, cosine_similarity_matrix, dclr_loss, dclr_noise_ascent, dclr_official_loss,
                     dclr_weights, distillation_kl, quantile_threshold)
from .ranking import in_batch_candidates, ranking_diagnostics


def mask_counts(masked: Tensor, comp_neg: Tensor) -> Tensor:
    """One training batch's addition to DCLR's ``mask_tally`` (4,): [1, the share of negatives masked, 1 if any
    was, the masked negatives' complementary cosines summed over the number of negatives].

    masked, comp_neg: (B, N) this device's anchors against every candidate. Under DDP the figures are the global
    batch's: every device holds B anchors and N candidates, so the global share is the mean of the devices'
    shares, and the batch masked if any device did."""
    share = masked.float().mean()
    cosine = torch.where(masked, comp_neg.float(), 0.0).sum() / masked.numel()
    _, world = rank_and_world()
    total = sum_over_ranks(torch.stack([share, cosine, (share > 0).float()]))  # (3,) summed over devices
    return torch.stack([torch.ones_like(share), total[0] / world, (total[2] > 0).float(), total[1] / world])


def load_complementary(model: str, pooling: Pooling) -> SentenceEncoder:
    """A SimCSE checkpoint of this codebase (``*.ckpt``, its own pooling) or a hub name/directory."""
    import encoders

    return encoders.load(model, None if model.endswith(".ckpt") else pooling)


ComplementaryHead = Literal["mlp", "pooler", "pooling"]


def complementary_head(model: str, encoder: nn.Module) -> ComplementaryHead:
    """Where the official code reads a complementary model's sentence vector: its *trained* head over [CLS].

    - a ``*.ckpt`` of this codebase with SimCSE's head: ``encoder.mlp`` over [CLS] ("mlp"); the
      transformer's own pooler is the start model's, which SimCSE training froze and never trained;
    - a hub or directory model with a pooler (a princeton SimCSE checkpoint, whose conversion script
      renamed SimCSE's trained MLP to ``pooler``): the transformer's ``pooler_output`` ("pooler");
    - anything else (a checkpoint without an MLP head, a model without a pooler): its own pooling.
    """
    if getattr(encoder, "mlp", None) is not None and getattr(encoder, "pooling", None) == "cls":
        return "mlp"
    if not model.endswith(".ckpt") and isinstance(getattr(getattr(encoder, "transformer", None), "pooler", None),
                                                   nn.Module):
        return "pooler"
    return "pooling"


class DCLR(SentenceEmbeddingModule):
    """Debiased Contrastive Learning of unsupervised sentence Representations (Zhou et al., ACL 2022).

    Batch key: ``sentence`` (``WikiDataModule``). Two dropout views give the positive pair, as in
    unsupervised SimCSE; DCLR changes the negatives in two ways:

    1. *Noise negatives* (``use_noise``): k = ``noise_ratio`` x batch size vectors from N(0, I), moved
       by ``noise_steps`` steps of gradient ascent of size ``noise_beta`` (losses.dclr_noise_ascent;
       the noise is its own leaf tensor and builds no graph into the encoder).
    2. *Instance weighting* (``use_weighting``): a frozen complementary model (a SimCSE encoder of
       this codebase, ``*.ckpt``, or a hub name) scores every negative from its own view; a negative
       whose complementary cosine with the anchor is >= ``phi`` gets weight 0, else 1. The complementary
       model is frozen (requires_grad off, under no_grad) and not stored in checkpoints (it is rebuilt
       from the config).

    Loss: -log( e^{s(h,h+)/tau} / (e^{s(h,h+)/tau} + sum_{noise and in-batch h-} w e^{s(h,h-)/tau}) ).

    Paper settings: tau 0.05; BERT-base phi 0.90, k 1; RoBERTa-base phi 0.85, k 2.5;
    BERT-large phi 0.90, k 4; RoBERTa-large phi 0.85, k 5; batch 128 (base) / 256 (large);
    lr 3e-5 (1e-5 RoBERTa-large); 3 epochs; max length 32; model selection on the mean of STS-B dev
    and SICK-R dev every 150 steps.

    ``form`` chooses between the paper and its official code (RUCAIBox/DCLR), which departs from the
    paper in seven ways; ``form="official"`` takes all seven:

    ============================  =====================================  ===========================================
    part                          paper                                  official code
    ============================  =====================================  ===========================================
    noise set                     one per sentence (B, k, H)             one per batch, shared (k, H)
    noise ascends                 L_U at tau                             the in-batch InfoNCE at tau
    noise weighted                yes, by the complementary cosine       never
    masked negative               removed (weight multiplies exp)        logit set to 0 (still adds exp(0))
    threshold                     cos >= phi                             strict cos/tau > phi/tau
    loss                          row cross-entropy (eq. 5)              BCE over softmax entries (dclr_official_loss)
    complementary cosines         one eval pass, its own pooling         two dropout passes, view 1 against view 2,
                                                                         of its trained head over [CLS]
    ============================  =====================================  ===========================================

    ``matryoshka_dims`` (base class) sums the loss over truncated embeddings (Kusupati et al. 2022): the in-batch
    cosines, the noise (drawn at each truncation's width) and, for ``complementary_model: self``, the weighting use
    the truncation; the complementary model's views and the distillation teacher are computed once per batch, and
    the paper form compares the noise with the first d dimensions of the complementary anchor.

    The complementary model's trained head (``complementary_head``): SimCSE's MLP (``encoder.mlp``) for
    a ``*.ckpt`` of this codebase, the transformer's ``pooler_output`` for a hub SimCSE checkpoint (its
    conversion script stores the trained MLP as ``pooler``). The official overlay
    (``configs/dclr/official.yaml``) adds the trainer's side: gradients clipped at 1.0, the STS-B +
    SICK-R dev mean every 125 steps, the best checkpoint. docs/DCLR.md lists what still differs.

    With the paper's settings neither mechanism need act (docs/DCLR.md): the ascent
    moves a noise vector of norm ~sqrt(H) by ``noise_beta`` in absolute terms, and a fixed phi may be
    above every in-batch complementary cosine. Two options make each act: ``noise_step="relative"``
    (each ascent step turns the noise by ``noise_beta`` times its own norm) and ``phi_quantile`` (the
    threshold is that quantile of each batch's complementary cosines, so the top ``1 - phi_quantile``
    of the negatives are always masked).

    Args:
        encoder: the sentence encoder.
        complementary_model: ``*.ckpt`` of this codebase's SimCSE, a hub name / directory, or ``self``
            (the paper's ablation: the model being trained weights its own negatives, detached).
        complementary_pooling: pooling of a hub complementary model in the paper form (checkpoints
            bring their own).
        temperature: tau.
        phi: weighting threshold on the complementary cosine, in (0, 1].
        noise_ratio: k / batch size (>= 0).
        noise_steps: gradient-ascent steps on the noise.
        noise_beta: step size of each ascent step.
        use_noise: add noise negatives (the paper's ablation "w/o noise").
        use_weighting: weight negatives by the complementary model (the paper's ablation "w/o weighting").
        form: the paper's DCLR or its official code's (the table above).
        noise_step: each ascent step moves a noise vector by ``noise_beta`` (paper) or by ``noise_beta``
            times its norm.
        phi_quantile: when set, the weighting threshold of each batch is this quantile of its
            complementary cosines (in-batch negatives) instead of ``phi``.
        gather_across_devices: in-batch negatives from all devices, with gradient.
        augmentation: the positive view: ``dropout`` (the paper's), or dropout plus one of ``token_shuffle``,
            ``token_cutoff``, ``span_cutoff``, ``feature_cutoff`` (encoders/augment.py; the paper's Table 6).
        augmentation_rate: the fraction of tokens or hidden dimensions a cutoff zeroes.
        distillation_weight: when > 0, the complementary model also teaches by distillation: this weight
            times KL(p_comp || p_model), each the softmax at ``temperature`` of one anchor's cosines with every
            in-batch candidate (its positive included); the teacher compares two dropout views of the complementary
            model (``distillation_teacher``), and the entropy and positive mass of both distributions are logged.
            With ``use_weighting=false`` it takes weighting's place (the distillation ablation).
    """

    batch_keys = ("sentence",)
    needs_unique_sentences = True
    supports_matryoshka = True

    def __init__(
        self,
        encoder: SentenceEncoder,
        complementary_model: str = "princeton-nlp/unsup-simcse-bert-base-uncased",
        complementary_pooling: Pooling = "cls_before_pooler",
        temperature: float = 0.05,
        phi: float = 0.9,
        noise_ratio: float = 1.0,
        noise_steps: int = 4,
        noise_beta: float = 1e-3,
        use_noise: bool = True,
        use_weighting: bool = True,
        form: Literal["paper", "official"] = "paper",
        noise_step: Literal["absolute", "relative"] = "absolute",
        phi_quantile: float | None = None,
        gather_across_devices: bool = True,
        augmentation: Augmentation = "dropout",
        augmentation_rate: float = 0.1,
        distillation_weight: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(encoder, **kwargs)
        check_augmentation(augmentation, augmentation_rate)
        if distillation_weight < 0:
            raise ValueError(f"model.init_args.distillation_weight must be >= 0, got {distillation_weight}")
        if distillation_weight > 0 and complementary_model == "self":
            raise ValueError("model.init_args.distillation_weight needs a complementary model other than 'self'")
        if temperature <= 0:
            raise ValueError(f"model.init_args.temperature must be positive, got {temperature}")
        if not 0 < phi <= 1:
            raise ValueError(f"model.init_args.phi must be in (0, 1], got {phi}")
        if noise_ratio < 0:
            raise ValueError(f"model.init_args.noise_ratio (k / batch size) must be >= 0, got {noise_ratio}")
        if phi_quantile is not None and not 0 < phi_quantile < 1:
            raise ValueError(f"model.init_args.phi_quantile must be in (0, 1), got {phi_quantile}")
        if noise_steps < 0 or noise_beta < 0:
            raise ValueError("model.init_args.noise_steps and noise_beta must be >= 0")
        if form not in ("paper", "official"):
            raise ValueError(f"model.init_args.form must be 'paper' or 'official', got {form!r}")
        self.temperature = temperature
        self.phi = phi
        self.noise_ratio = noise_ratio
        self.noise_steps = noise_steps
        self.noise_beta = noise_beta
        self.use_noise = use_noise and noise_ratio > 0
        self.use_weighting = use_weighting
        self.form = form
        self.official = form == "official"
        self.noise_step = noise_step
        self.phi_quantile = phi_quantile
        self.gather_across_devices = gather_across_devices
        self.augmentation = augmentation
        self.augmentation_rate = augmentation_rate
        self.distillation_weight = distillation_weight
        self.complementary: SentenceEncoder | None = None
        self.complementary_head: ComplementaryHead = "pooling"
        self.self_weighting = use_weighting and complementary_model == "self"
        if (use_weighting or distillation_weight > 0) and not self.self_weighting:
            self.complementary = load_complementary(complementary_model, complementary_pooling)
            if self.official:
                self.complementary_head = complementary_head(complementary_model, self.complementary)
            # Only the paper form weights the noise, which compares the two models' vectors directly; the
            # official form never does, so a complementary model of another width is fine there.
            if self.use_noise and use_weighting and not self.official and self.complementary.dim != encoder.dim:
                raise ValueError(
                    f"model.init_args.complementary_model: its embeddings have {self.complementary.dim} dimensions, "
                    f"the encoder's {encoder.dim}; the paper form weights noise negatives by comparing them "
                    "directly (form: official never weights noise)"
                )
            self.complementary.requires_grad_(False).eval()
        # The complementary model is rebuilt from the config, not stored in checkpoints.
        self.strict_loading = False
        # The weighting over every training batch so far, not only the one in log_every_n_steps that reaches the
        # logger: [batches, the sum of their masked fractions, batches that masked any negative, the sum of their
        # masked negatives' complementary cosines over the number of negatives]. A threshold such as phi 0.9 may
        # mask at a few batches between two logged ones; these counts show it, and the cosine of what was masked
        # is a mean over every masked negative of the run (a per-step scalar logged only when a batch masks
        # would be repeated by Lightning at later logged steps: see SentenceEmbeddingModule.training_step). Under DDP each
        # step's counts are those of the global batch. They travel in checkpoints, so a resumed run logs what an
        # uninterrupted one would. fp32 (MPS has no fp64) counts batches exactly up to 2**24.
        self.register_buffer("mask_tally", torch.zeros(4), persistent=False)

    def frozen_modules(self) -> list[nn.Module]:
        return [self.complementary] if self.complementary is not None else []

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("complementary.")}
        checkpoint["dclr_mask_tally"] = self.mask_tally.tolist()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if "dclr_mask_tally" in checkpoint:  # absent from checkpoints written before the tally existed
            tally = list(checkpoint["dclr_mask_tally"])
            if len(tally) == 3:  # written before the masked cosine was counted: unknown if anything was masked
                tally.append(0.0 if tally[1] == 0 else math.nan)
            self.mask_tally.copy_(torch.tensor(tally))

    def _count_masks(self, masked: Tensor, comp_neg: Tensor, logs: dict[str, Any]) -> None:
        """Adds one training batch's mask (B, N) and its negatives' complementary cosines (B, N) to
        ``mask_tally`` and logs the whole run's figures so far."""
        self.mask_tally += mask_counts(masked, comp_neg)
        batches, masked_sum, masking, cosine_sum = self.mask_tally.unbind()
        logs["masked_fraction_so_far"] = masked_sum / batches
        logs["masking_batches_so_far"] = masking / batches
        if masked_sum > 0 and not cosine_sum.isnan():  # from the first mask on: a mean needs something masked
            logs["masked_comp_cosine_so_far"] = cosine_sum / masked_sum

    def _noise(self, batch_size: int, negatives: int, dim: int, device: torch.device) -> Tensor:
        """k = noise_ratio x the number of in-batch candidates (the global batch when gathering)."""
        k = max(1, round(self.noise_ratio * negatives))
        shape = (k, dim) if self.official else (batch_size, k, dim)
        return torch.randn(shape, device=device)  # (k, H) shared or (B, k, H) per sentence

    @torch.no_grad()
    def _complementary_views(self, features: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """The complementary model's anchors (B, H') and its candidates (B, H').

        Paper form: one eval-mode pass with the model's own pooling, compared with itself. Official
        form: two train-mode (dropout on) passes of its trained head, view 1 against view 2, as the
        official code scores z1_fix against z2_fix."""
        comp = self.complementary
        if not self.official:
            z = comp(features).float()  # (B, H')
            return z, z
        comp.train()
        try:
            return self._complementary_embed(features), self._complementary_embed(features)
        finally:
            comp.eval()

    @torch.no_grad()
    def distillation_teacher(self, features: dict[str, Tensor]) -> Tensor:
        """The distillation teacher's similarities (B, world*B): two dropout passes of the complementary model
        (its trained head, as the official code scores its complementary model), view 1 against view 2, so its
        positive is a pair of views as the student's is, not a vector compared with itself (cosine 1, which at
        tau 0.05 puts nearly all of the teacher's probability on the positive)."""
        comp = self.complementary
        comp.train()
        try:
            z1, z2 = self._complementary_embed(features), self._complementary_embed(features)  # (B, H') each
        finally:
            comp.eval()
        z2_all = gather_with_grad(z2) if self.gather_across_devices else z2  # (world*B, H')
        return cosine_similarity_matrix(z1, z2_all)

    def _complementary_embed(self, features: dict[str, Tensor]) -> Tensor:
        """One pass of the complementary model's trained head over [CLS] (``complementary_head``)."""
        comp = self.complementary
        if self.complementary_head == "pooler":
            out = comp.transformer(input_ids=features["input_ids"], attention_mask=features["attention_mask"])
            return out.pooler_output.float()  # (B, H') a hub SimCSE checkpoint's trained MLP, stored as pooler
        return comp(features).float()  # (B, H') "mlp": in train mode a SimCSE encoder applies its trained MLP

    def _weights(self, comp_sims: Tensor, threshold: Tensor | None) -> Tensor:
        if threshold is None:
            return dclr_weights(comp_sims, self.phi, "official" if self.official else "paper", self.temperature)
        return (comp_sims < threshold).to(comp_sims.dtype)  # (B, N) 0 at or above the batch's quantile

    def training_loss(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
        features = batch["sentence"]
        z1 = self.encoder(features).float()  # (B, H) anchors
        # (B, H) positives: the same sentences, another dropout mask (and the augmentation, when one is set)
        z2 = self.encoder(positive_view(features, self.augmentation, self.augmentation_rate, self.encoder.dim)).float()
        logs: dict[str, Any] = {}
        once: dict[str, Any] = {}  # the complementary model's views and the teacher: one pass per batch

        def loss_fn(embeddings: list[Tensor]) -> Tensor:
            return self._loss(features, embeddings[0], embeddings[1], once, logs)

        loss = self.matryoshka(loss_fn)([z1, z2])
        if "masked" in once and self.training:  # once per batch, whatever the Matryoshka dimensions
            self._count_masks(*once["masked"], logs)
        return loss, logs

    def _loss(self, features: dict[str, Tensor], z1: Tensor, z2: Tensor, once: dict[str, Any],
              logs: dict[str, Any]) -> Tensor:
        """DCLR's loss on the anchors z1 and positives z2 (B, d); ``once`` keeps what does not depend on them
        (the complementary model's views, the distillation teacher), so Matryoshka dimensions share it."""
        B = z1.shape[0]
        z2_all, labels = in_batch_candidates(z1, z2, None, self.gather_across_devices)  # (world*B, d), (B,)
        sims = cosine_similarity_matrix(z1, z2_all)  # (B, world*B)
        others = torch.ones_like(sims, dtype=torch.bool)
        others[torch.arange(B), labels] = False
        pos = sims[torch.arange(B), labels]  # (B,)
        neg = sims[others].view(B, -1)  # (B, world*B - 1) in-batch negatives
        weights = torch.ones_like(neg)

        comp_anchor = comp_sims = threshold = None
        if self.complementary is not None or self.self_weighting:
            with torch.no_grad():
                if self.self_weighting:  # the paper's ablation: the model being trained scores its own negatives
                    comp_anchor, comp_all = z1.detach(), z2_all.detach()  # (B, d), (world*B, d)
                else:
                    if "comp" not in once:
                        comp_anchor, comp_view = self._complementary_views(features)  # (B, H') each
                        comp_all = gather_with_grad(comp_view) if self.gather_across_devices else comp_view
                        once["comp"] = comp_anchor, comp_all
                    comp_anchor, comp_all = once["comp"]
                comp_sims = cosine_similarity_matrix(comp_anchor, comp_all)  # (B, world*B)
                comp_neg = comp_sims[others].view(B, -1)  # (B, world*B - 1)
        if comp_sims is not None and self.use_weighting:
            with torch.no_grad():
                if self.phi_quantile is not None:
                    threshold = quantile_threshold(comp_neg, self.phi_quantile)
                    logs["threshold"] = threshold
                weights = self._weights(comp_neg, threshold)
            masked = weights == 0
            once["masked"] = masked, comp_neg  # from the complementary model: the same at every Matryoshka dimension
            logs["masked_fraction"] = masked.float().mean()
            if (~masked).any():
                logs["kept_comp_cosine"] = comp_neg[~masked].mean()

        if self.use_noise:
            noise = self._noise(B, z2_all.shape[0], z1.shape[1], z1.device)
            in_batch = None
            if self.official:  # the ascent's objective: InfoNCE over the in-batch negatives and the noise
                in_batch = z2_all.detach().expand(B, -1, -1)[others].view(B, -1, z1.shape[1])  # (B, world*B-1, H)
            noise, diag = dclr_noise_ascent(z1, z2, noise, self.temperature, self.noise_steps, self.noise_beta,
                                            "infonce" if self.official else "uniformity", in_batch,
                                            relative_step=self.noise_step == "relative")
            logs.update(noise_cos_shift=diag["cos_shift"], noise_step_norm=diag["noise_step_norm"],
                        noise_lu_before=diag["lu_before"], noise_lu_after=diag["lu_after"])
            noise_sims = anchor_cosines(z1, noise)  # (B, k): noise shared (k, H) or per anchor (B, k, H)
            noise_weights = torch.ones_like(noise_sims)
            if comp_anchor is not None and self.use_weighting and not self.official:
                # The paper weights noise too. The noise lives in the trained model's space, so this cosine
                # compares vectors of two models (train/noise_masked_fraction logs how many it masks).
                with torch.no_grad():
                    # A Matryoshka truncation d compares the noise with the first d of the complementary
                    # anchor's dimensions (the same width: checked in __init__).
                    comp_noise = anchor_cosines(comp_anchor[..., :noise.shape[-1]], noise)  # (B, k)
                    noise_weights = self._weights(comp_noise, threshold)
                logs["noise_masked_fraction"] = (noise_weights == 0).float().mean()
            neg = torch.cat([neg, noise_sims], dim=-1)  # (B, world*B - 1 + k)
            weights = torch.cat([weights, noise_weights], dim=-1)

        if self.official:
            loss = dclr_official_loss(pos, neg, weights, self.temperature)
        else:
            loss = dclr_loss(pos, neg, weights, self.temperature, "remove")
        if self.distillation_weight > 0:
            if "teacher" not in once:
                once["teacher"] = self.distillation_teacher(features)  # (B, world*B)
            teacher = once["teacher"]
            distill = distillation_kl(teacher, sims, self.temperature)
            logs["distillation_kl"] = distill.detach()
            for name, row_sims in (("teacher", teacher), ("student", sims.detach())):
                p = torch.softmax(row_sims.float() / self.temperature, dim=-1)  # (B, world*B)
                logs[f"distill_{name}_entropy"] = -(p * p.clamp_min(1e-12).log()).sum(-1).mean()
                logs[f"distill_{name}_positive_mass"] = p[torch.arange(B), labels].mean()
            loss = loss + self.distillation_weight * distill
        accuracy = ((pos[:, None] > neg) | (weights == 0)).all(-1).float().mean()  # over kept negatives
        logs.update(ranking_diagnostics(z1, z2, accuracy), temperature=self.temperature)
        return loss
