"""One LightningModule per objective, their base class, and the loss maths they share.

Imports are lazy (PEP 562), so ``lightning_modules.losses`` can be used, and worker processes
spawned, without importing Lightning and transformers.
"""
import importlib

_EXPORTS = {
    "SentenceEmbeddingModule": "base",
    "NLISoftmax": "nli_softmax",
    "STSRegression": "sts_regression",
    "Triplet": "triplet",
    "MNR": "mnr",
    "SimCSE": "simcse",
    "DCLR": "dclr",
    "FILMObjective": "film",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
