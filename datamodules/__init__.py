"""DataModules: one per data family, sharing tokenization, batching and STS validation."""
from .base import SentenceDataModule
from .film import FILMDataModule
from .io import DataError
from .nli import NLIDataModule
from .sts import STS_TASKS, STSDataModule, load_sts_pairs, load_sts_task, sts_task_files
from .wiki import WikiDataModule

__all__ = ["DataError", "FILMDataModule", "NLIDataModule", "STSDataModule", "STS_TASKS", "SentenceDataModule",
           "WikiDataModule", "load_sts_pairs", "load_sts_task", "sts_task_files"]
