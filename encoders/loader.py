"""The one front door from "a checkpoint, a folder or a hub name" to an encoder.

``load(source)`` is what ``evaluate.py``, DCLR's complementary model, the notebooks and the
benchmarks call. ``source`` is one of:

- a ``*.ckpt`` (or any file) written by ``train.py``: the trained encoder, with the pooling and heads
  of its run;
- a sentence-transformers directory (``modules.json``): its Transformer, Pooling and Dense modules;
- a plain Hugging Face model directory (``config.json``): the transformer with ``pooling``;
- a hub id (``bert-base-uncased``, ``princeton-nlp/unsup-simcse-bert-base-uncased``): a
  sentence-transformers repository as its own directory would be read, any other as a plain model.

A local-looking path that does not exist, or a directory that holds no model, is an error before
any hub request.
"""
from __future__ import annotations

import os
from typing import Optional

from torch import nn

from .hub import ModelResolutionError, looks_like_path, resolve_model_name
from .sentence import Pooling, SentenceEncoder

# What a sentence-transformers repository needs from the hub: configs, vocabularies, weights.
ST_REPO_FILES = ["*.json", "*.txt", "*.model", "*.safetensors", "*/*.json", "*/*.safetensors"]


def load(source: str, pooling: Optional[Pooling] = None) -> nn.Module:
    """The encoder named by ``source``, in eval mode.

    Args:
        source: a ``*.ckpt`` of this codebase, a sentence-transformers directory, a Hugging Face
            model directory, or a hub id.
        pooling: for a model without its own pooling (a plain directory or hub model: default
            ``mean``), or to replace a sentence-transformers directory's; a checkpoint always
            pools as its run did, so giving one is an error.
    """
    if source.endswith(".ckpt") or os.path.isfile(source):
        if pooling is not None:
            raise ValueError(f"{source}: a checkpoint pools as its run did (its config); give no pooling for it")
        from .checkpoint import encoder_from_checkpoint

        return encoder_from_checkpoint(source)[0]
    if os.path.isdir(source):
        return _load_directory(source, pooling)
    if looks_like_path(source):
        raise ModelResolutionError(f"no such model directory: {source}")
    path = resolve_model_name(source)  # the verified offline copy, the cache's copy, or the hub id
    if os.path.isdir(path):
        return _load_directory(path, pooling)
    st_dir = _sentence_transformers_repo(path)
    if st_dir is not None:
        return _load_directory(st_dir, pooling)
    return SentenceEncoder(path, pooling=pooling or "mean").eval()


def _load_directory(path: str, pooling: Optional[Pooling]) -> nn.Module:
    if os.path.isfile(os.path.join(path, "modules.json")):
        from .st_format import load_sentence_transformers_dir

        return load_sentence_transformers_dir(path, pooling)
    if os.path.isfile(os.path.join(path, "config.json")):
        return SentenceEncoder(path, pooling=pooling or "mean").eval()
    raise ModelResolutionError(f"{path}: not a model directory (no config.json or modules.json)")


def _sentence_transformers_repo(repo_id: str) -> str | None:
    """The downloaded directory of a hub repository that holds a sentence-transformers model, or
    None for a plain Hugging Face model (no ``modules.json``)."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        hf_hub_download(repo_id, "modules.json")
    except EntryNotFoundError:
        return None
    except Exception as err:  # unknown repository, offline without a cached copy: from_pretrained says it
        if type(err).__name__ in ("RepositoryNotFoundError", "LocalEntryNotFoundError", "RevisionNotFoundError"):
            return None
        raise
    return snapshot_download(repo_id, allow_patterns=ST_REPO_FILES)
