"""DataModules: one per data family, sharing tokenization, batching and STS validation."""
from .base import SentenceDataModule, load_sts_pairs
from .film import FILMDataModule
from .io import DataError
from .nli import NLIDataModule
from .sts import STS_TASKS, STSDataModule, sts_task_files
from .wiki import WikiDataModule

__all__ = ["DataError", "FILMDataModule", "NLIDataModule", "STSDataModule", "STS_TASKS", "SentenceDataModule",
           "WikiDataModule", "load_sts_pairs", "sts_task_files"]
