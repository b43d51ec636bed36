"""DataModules: one per data family, sharing tokenization, batching and STS validation.

Imports are lazy (PEP 562): ``datamodules.paths`` is usable without loading datasets and torch.
"""
import importlib

_EXPORTS = {
    "SentenceDataModule": "base",
    "FILMDataModule": "film",
    "DataError": "io",
    "NLIDataModule": "nli",
    "STS_TASKS": "sts",
    "STSDataModule": "sts",
    "load_sts_pairs": "sts",
    "load_sts_task": "sts",
    "sts_task_files": "sts",
    "WikiDataModule": "wiki",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
