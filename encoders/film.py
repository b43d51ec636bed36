"""FILM's model: sentence -> TF-IDF or frozen-encoder features -> the learned low-rank map ``L x``."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Literal, Sequence

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .sentence import SentenceEncoder
from .tfidf import tfidf_features

Features = Literal["tfidf", "encoder"]


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch threads (None: unchanged), then restore the setting."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class FILMEncoder(nn.Module):
    """The model FILM learns: sentence -> features x (L2-normalised) -> ``L x`` (d dims).

    Features are TF-IDF (a scikit-learn ``TfidfVectorizer`` fitted on the training sentences and
    kept as its vocabulary and idf, so no pickled object is needed to rebuild it) or the embeddings
    of a frozen ``SentenceEncoder`` (eval mode, no gradients). ``projection`` is FILM's ``L``
    (d, D), float64 as the solver computes it; before training it is zero, and for TF-IDF it (and
    ``idf``) only exists once the vocabulary is fitted, since D is the vocabulary's size.

    Args:
        features: ``tfidf`` or ``encoder``.
        dim: d, the dimension of the learned space.
        encoder: the frozen sentence encoder (``features="encoder"`` only).
        tfidf_args: ``TfidfVectorizer`` keyword arguments (``features="tfidf"`` only).
        vocabulary: the fitted TF-IDF vocabulary, one term per feature (rebuilding from a checkpoint).
    """

    def __init__(
        self,
        features: Features,
        dim: int,
        encoder: SentenceEncoder | None = None,
        tfidf_args: dict[str, Any] | None = None,
        vocabulary: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if features not in ("tfidf", "encoder"):
            raise ValueError(f"features must be 'tfidf' or 'encoder', got {features!r}")
        if features == "encoder" and encoder is None:
            raise ValueError("model.encoder: features='encoder' needs a frozen SentenceEncoder (e.g. all-MiniLM-L6-v2)")
        if features == "tfidf" and encoder is not None:
            raise ValueError("model.encoder is only used with features='encoder'; remove it or set features: encoder")
        self.features = features
        self.dim = dim
        self.tfidf_args = dict(tfidf_args or {})
        self.vocabulary = list(vocabulary or [])
        self.base = encoder.requires_grad_(False).eval() if encoder is not None else None
        width = encoder.dim if encoder is not None else len(self.vocabulary) or None
        self.register_buffer("projection", torch.zeros(dim, width, dtype=torch.float64) if width else None)  # (d, D)
        self.register_buffer("idf", torch.zeros(width, dtype=torch.float64) if width and encoder is None else None)
        self._vectorizer = None
        self._cache: dict[str, Tensor] = {}  # frozen features of the training and dev sentences
        # a new idf (a loaded checkpoint) means a new vectorizer
        self.register_load_state_dict_post_hook(lambda module, keys: setattr(module, "_vectorizer", None))

    @property
    def config_dict(self) -> dict[str, Any]:
        """Everything besides the state dict needed to rebuild this model (``from_checkpoint_config``)."""
        config: dict[str, Any] = {"features": self.features, "dim": self.dim}
        if self.base is not None:
            config["encoder"] = dict(self.base.config_dict)
        else:
            config["tfidf_args"] = dict(self.tfidf_args)
            config["vocabulary"] = list(self.vocabulary)
        return config

    @classmethod
    def from_checkpoint_config(cls, config: dict[str, Any]) -> "FILMEncoder":
        """Rebuild the architecture from a checkpoint's ``encoder_config`` (weights loaded after)."""
        encoder = SentenceEncoder.from_checkpoint_config(config["encoder"]) if "encoder" in config else None
        return cls(config["features"], config["dim"], encoder, config.get("tfidf_args"), config.get("vocabulary"))

    @property
    def pooling(self) -> str | None:
        """The frozen encoder's pooling (what evaluate.py reports); None for TF-IDF."""
        return self.base.pooling if self.base is not None else None

    # -- features -------------------------------------------------------------------------
    def fit_features(self, sentences: Sequence[str], also: Sequence[str] = (), batch_size: int = 64,
                     precision: Literal["32", "bf16", "16"] = "32") -> Tensor | sp.csc_matrix:
        """Features of the training sentences as FILM wants them, (D, n) with one column per sentence.

        TF-IDF: fits the vectorizer on ``sentences`` (sizing ``projection`` to the vocabulary).
        Encoder: embeds ``sentences`` and ``also`` (the dev sentences) once and remembers them, so
        validation never runs the frozen encoder again.
        """
        if self.base is None:
            X, vectorizer = tfidf_features(sentences, **self.tfidf_args)  # (D, n) CSC
            self._vectorizer = vectorizer
            self.vocabulary = vectorizer.get_feature_names_out().tolist()
            self.idf = torch.from_numpy(vectorizer.idf_.astype(np.float64))  # (D,)
            self.projection = torch.zeros(self.dim, len(self.vocabulary), dtype=torch.float64)  # (d, D)
            return X
        new = list(dict.fromkeys(s for s in [*sentences, *also] if s not in self._cache))
        if new:
            embeddings = self.base.encode(new, batch_size=batch_size, precision=precision).cpu()  # (N, D)
            bad = (~torch.isfinite(embeddings).all(dim=1)).nonzero()
            if len(bad):
                raise ValueError(
                    f"the frozen encoder {self.base.config_dict['model_name']!r} gives NaN or inf features for "
                    f"{len(bad)} of {len(new)} sentences (first: {new[int(bad[0])]!r}); FILM cannot use them"
                )
            self._cache.update(zip(new, embeddings))
        return torch.stack([self._cache[s] for s in sentences], dim=1)  # (D, n)

    def _tfidf(self):
        if self._vectorizer is None:
            from sklearn.feature_extraction.text import TfidfVectorizer

            if not self.vocabulary:
                raise RuntimeError("the TF-IDF vectorizer is not fitted: train the model or load a checkpoint")
            vectorizer = TfidfVectorizer(**self.tfidf_args, vocabulary={t: i for i, t in enumerate(self.vocabulary)})
            vectorizer.idf_ = self.idf.cpu().numpy()
            self._vectorizer = vectorizer
        return self._vectorizer

    def project(self, sentences: Sequence[str], batch_size: int = 64, precision: Literal["32", "bf16", "16"] = "32",
                cached: bool = False, device: str | torch.device | None = None) -> Tensor:
        """``L x`` of each sentence, float64 (N, d). ``cached``: use the remembered frozen features;
        ``batch_size``, ``precision`` and ``device`` are the frozen encoder's ``encode`` arguments."""
        if self.base is None:
            X = self._tfidf().transform(list(sentences))  # (N, D) CSR, rows L2-normalised by sklearn
            Y = X @ self.projection.cpu().numpy().T  # (N, d)
            return torch.from_numpy(np.asarray(Y)).to(self.projection.device)
        if cached and all(s in self._cache for s in sentences):
            X = torch.stack([self._cache[s] for s in sentences])  # (N, D)
        else:
            X = self.base.encode(sentences, batch_size=batch_size, precision=precision, device=device)  # (N, D)
        X = F.normalize(X.to(self.projection), dim=-1)  # FILM normalises feature columns too
        return X @ self.projection.T  # (N, d)

    def forward(self, sentences: list[str]) -> Tensor:
        """Raw sentences -> (B, d) float32, with the remembered features (validation during a fit)."""
        return self.project(sentences, cached=True).float()

    @torch.inference_mode()
    def encode(self, sentences: Sequence[str], batch_size: int = 64, normalize: bool = False,
               precision: Literal["32", "bf16", "16"] = "32", device: str | torch.device | None = None) -> Tensor:
        """Embed sentences: (N, d) float32 in input order (the ``SentenceEncoder.encode`` interface).

        ``batch_size``, ``precision`` and ``device`` apply to the frozen encoder; TF-IDF ignores them. Features
        are always computed afresh here, at the precision asked for.
        """
        if len(sentences) == 0:
            return torch.empty(0, self.dim)
        out = self.project(list(sentences), batch_size=batch_size, precision=precision, device=device).float()
        return F.normalize(out, dim=-1) if normalize else out
