"""Models: the shared sentence encoder, FILM's encoder, offline-model resolution, checkpoints and the
sentence-transformers format. ``encoders.load(source)`` is the one way in from a checkpoint, a
directory or a hub name.

Imports are lazy (PEP 562): ``encoders.hub`` is usable without loading transformers.
"""
import importlib

_EXPORTS = {
    "SentenceEncoder": "sentence",
    "POOLINGS": "sentence",
    "FILMEncoder": "film",
    "encoder_from_checkpoint": "checkpoint",
    "resolve_model_name": "hub",
    "load": "loader",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
