"""FILM as an objective: low-rank metric learning over TF-IDF or frozen sentence embeddings.

The maths and the solver live in ``film_solver/``, the model (features and the learned map) in
``encoders/film.py``; this file is the plumbing: the solver step as Lightning's optimizer step, and
checkpoints that ``torch.load(weights_only=True)`` can read.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Literal, Optional

import torch
from torch import Tensor, nn

from encoders.film import Features, FILMEncoder, torch_threads
from encoders.sentence import SentenceEncoder

from .base import SentenceEmbeddingModule
from .film_solver import FILM, FILMState

log = logging.getLogger(__name__)


class FILMStep(torch.optim.Optimizer):
    """FILM's solver step seen as a torch optimizer, so Lightning counts it like any optimizer step
    (``global_step``, ``trainer.max_steps``, checkpoint names).

    ``step()`` is one ``FILM.step``: a Cayley / Barzilai-Borwein / non-monotone-search step, or one
    M-FILM step. The parameter is a copy of the Stiefel point P (r, d), updated in place. The
    solver's whole state (reduced coordinates, basis, P, s, step size, line-search reference)
    is this optimizer's ``state_dict``, as AdamW's moments are AdamW's, so a run resumes exactly
    (``--ckpt_path``) without recomputing it; tensors, numbers and lists only (weights_only).
    """

    def __init__(self, solver: FILM, state: FILMState) -> None:
        self.solver = solver
        self.film_state = state
        super().__init__([state.P.detach().clone()], defaults={})

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self.solver.step(self.film_state)
        self.param_groups[0]["params"][0].copy_(self.film_state.P)
        return loss

    def state_dict(self) -> dict[str, Any]:
        film_state = {}
        for field in dataclasses.fields(FILMState):
            value = getattr(self.film_state, field.name)
            if field.name == "t0":
                continue  # a clock reading: the resumed run keeps its own
            if field.name == "history":
                value = value[-4:]  # what the convergence test looks back on
            elif isinstance(value, torch.Generator):
                value = value.get_state()
            film_state[field.name] = value
        return {**super().state_dict(), "film_state": film_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop("film_state")
        super().load_state_dict(state_dict)
        for name, value in saved.items():
            if name == "rng" and value is not None:
                value = torch.Generator().set_state(value)
            setattr(self.film_state, name, value)  # in place: the objective holds the same state
        self.param_groups[0]["params"][0].copy_(self.film_state.P)


class FILMObjective(SentenceEmbeddingModule):
    """FILM: fast and interpretable low-rank metric learning (Tang & Aw 2020, arXiv:2010.05523).

    Learns ``L = diag(sqrt(s)) P^T R U^T`` (d x D) with P on the Stiefel manifold St(r, d), so that
    each anchor sentence is closer (dot product in the learned space) to its positives than to its
    negatives by a margin (hinge averaged per anchor, plus ``l2/2 ||s||^2``); see ``film_solver``.
    Features are TF-IDF fitted on the training sentences or frozen sentence embeddings, computed once.

    Data: ``datamodules.FILMDataModule``, whose ``train_sentences`` and ``train_triplets`` (anchor,
    positive, negative indices) this module reads in ``setup``; there are no training batches. Each
    training step is one solver step (manual optimisation; the solver is the optimizer), logging
    ``train/loss``, ``train/active_set_size``, ``train/step_size``, ``train/orthogonality_error``,
    ``train/grad_norm``. The run stops when the solver converges or at ``trainer.max_steps``, and
    validates once more on its last step. Validation (``val/stsb_spearman`` ...) is the base class's:
    cosine in the learned space on the dev pairs. The solver's state is the optimizer's state, so
    ``--ckpt_path`` resumes a run where it stopped. One device only (the solver is full-batch).

    Paper defaults (the solver's): margin 1, l2 1, spectral initialisation, BB step sizes with
    Zhang-Hager non-monotone search (rho 1e-4, eta 0.85, delta 0.2). The low rank r and d are ours
    to choose; ``rank: null`` takes ``min(D, n, max(8 d, 256))``.

    Args:
        features: ``tfidf`` (fitted on the training sentences) or ``encoder`` (frozen ``encoder``).
        encoder: the frozen sentence encoder for ``features: encoder``.
        dim: d, the dimension of the learned space.
        rank: r of the truncated SVD of the features (null: the solver's default above).
        margin: hinge margin m.
        l2: lambda of the penalty ``lambda/2 ||s||^2`` (> 0).
        tol: convergence tolerance (gradient norm, or mean relative loss change over 5 steps).
        smooth: softplus temperature for the scales s (null: the exact ``max(c/lambda, 0)``; smoothing
            skips the exact active-set polish and makes each step cheaper).
        minibatch: anchors per M-FILM step (null: full-batch FILM).
        minibatch_step: M-FILM's initial normalised step size.
        whiten: ``R = sqrt(n) S^-1`` (true) or the identity.
        init: ``spectral`` (top-d eigenvectors with every anchor active) or ``random``.
        seed: the solver's seed (random init, M-FILM's anchor order, the sparse SVD's start vector).
        tfidf_ngram_range: word n-grams of the TF-IDF vocabulary.
        tfidf_min_df: drop terms in fewer training sentences than this.
        tfidf_sublinear_tf: ``1 + log(tf)`` instead of tf.
        tfidf_stop_words: scikit-learn's English stop-word list, or none.
        solver_threads: torch threads while the solver runs (null: torch's setting). Its matrices are
            small (anchors x r, r x d): on a busy machine more threads mostly wait for cores
            (docs/FILM.md, solver_threads).
        encode_batch_size: sentences per batch of the frozen encoder.
        encode_precision: precision of the frozen encoder when computing training/dev features
            (evaluate.py's ``--precision`` decides at evaluation).
        alignment_threshold: rescaled gold score from which a dev pair counts as positive (val/alignment).
    """

    batch_keys = ("sentences", "triplets")  # the whole corpus: FILM has no training batches

    def __init__(
        self,
        features: Features = "tfidf",
        encoder: Optional[SentenceEncoder] = None,
        dim: int = 64,
        rank: Optional[int] = None,
        margin: float = 1.0,
        l2: float = 1.0,
        tol: float = 1e-6,
        smooth: Optional[float] = None,
        minibatch: Optional[int] = None,
        minibatch_step: float = 0.5,
        whiten: bool = True,
        init: Literal["spectral", "random"] = "spectral",
        seed: int = 0,
        tfidf_ngram_range: tuple[int, int] = (1, 1),
        tfidf_min_df: int = 1,
        tfidf_sublinear_tf: bool = False,
        tfidf_stop_words: Optional[Literal["english"]] = None,
        solver_threads: Optional[int] = 1,
        encode_batch_size: int = 64,
        encode_precision: Literal["32", "bf16", "16"] = "32",
        alignment_threshold: float = 0.8,
    ) -> None:
        if rank is not None and dim > rank:
            raise ValueError(f"model.dim d={dim} is larger than model.rank r={rank}; need d <= r")
        if not 1 <= tfidf_ngram_range[0] <= tfidf_ngram_range[1]:
            raise ValueError(f"model.tfidf_ngram_range must be (low, high), 1 <= low <= high, got {tfidf_ngram_range}")
        tfidf_args = dict(ngram_range=tuple(tfidf_ngram_range), min_df=tfidf_min_df,
                          sublinear_tf=tfidf_sublinear_tf, stop_words=tfidf_stop_words)
        solver = FILM(dim=dim, rank=rank, margin=margin, l2=l2, tol=tol, minibatch=minibatch,  # checks its arguments
                      minibatch_step=minibatch_step, smooth=smooth, whiten=whiten, init=init, seed=seed)
        model = FILMEncoder(features, dim, encoder, tfidf_args if features == "tfidf" else None)
        super().__init__(model, alignment_threshold=alignment_threshold)
        # FILM has no learning rate or schedule: keep only its own arguments as hyperparameters
        self.save_hyperparameters(ignore=["encoder"])
        self.automatic_optimization = False
        self.solver = solver
        self._state: FILMState | None = None
        self._synced_iteration = -1

    def frozen_modules(self) -> list[nn.Module]:
        return [self.encoder.base] if self.encoder.base is not None else []

    # -- set-up: features, triplets, the solver's initial state ------------------------------
    def setup(self, stage: str) -> None:
        super().setup(stage)
        # "validate" too: train.py validates the start model (FILM's spectral initialisation) first
        if stage not in ("fit", "validate") or self._state is not None:
            return
        if self.trainer.max_steps < 0:
            raise ValueError("trainer.max_steps: FILM needs a cap on solver steps (e.g. 200); "
                             "it stops earlier when the solver converges")
        if self.trainer.world_size > 1:
            raise ValueError("trainer.devices: FILM's solver is full-batch and runs on one device; use 1")
        datamodule = self.trainer.datamodule  # its contract check (batch_keys) ran in its setup
        sentences, triplets = datamodule.train_sentences, datamodule.train_triplets
        dev = [s for d in datamodule.dev_sets.values() for s in d.sentences]
        X = self.encoder.fit_features(sentences, also=dev, batch_size=self.hparams.encode_batch_size,
                                      precision=self.hparams.encode_precision)  # (D, n)
        log.info("FILM: %d x %d %s features, %d triplets", X.shape[0], X.shape[1], self.hparams.features, len(triplets))
        with torch_threads(self.hparams.solver_threads):
            self._state = self.solver.init_state(X, triplets)
        self._sync_projection()

    def configure_optimizers(self) -> FILMStep:
        return FILMStep(self.solver, self._state)

    # -- training: one solver step per training step -----------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> None:
        with torch_threads(self.hparams.solver_threads):
            self.optimizers().step()
        info = self._state.history[-1]
        self.log("train/loss", info["loss"], prog_bar=True, batch_size=1)
        for name in ("active_set_size", "step_size", "orthogonality_error", "grad_norm"):
            self.log(f"train/{name}", float(info[name]), batch_size=1)
        if self._state.converged or self.trainer.global_step >= self.trainer.max_steps:
            # Stopping through should_stop makes Lightning validate this last step before it ends,
            # so the best checkpoint and last.ckpt both see the final map.
            self.trainer.should_stop = True

    def _sync_projection(self) -> None:
        """Write the current L into the model (it is only needed for validation, export and saving)."""
        state = self._state
        if state is None or self._synced_iteration == state.iteration:
            return
        with torch_threads(self.hparams.solver_threads):
            self.solver.finalize(state)
        self.encoder.projection.copy_(self.solver.L_)
        self._synced_iteration = state.iteration

    def on_validation_start(self) -> None:
        self._sync_projection()

    def on_train_end(self) -> None:
        self._sync_projection()

    def encode(self, sentences: list[str], **kwargs) -> Tensor:
        self._sync_projection()
        return super().encode(sentences, **kwargs)

    # -- checkpoints ------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning took the state dict before this hook: make sure it holds the current L.
        self._sync_projection()
        checkpoint["state_dict"]["encoder.projection"] = self.encoder.projection.detach().clone()
        super().on_save_checkpoint(checkpoint)
