"""``encoders.load``: one way in from a checkpoint, a sentence-transformers directory, a Hugging Face
directory or a hub id, and the errors a user meets before any hub request."""
from __future__ import annotations

import os
import time

import pytest
import torch

import encoders
import encoders.hub as hub
from encoders.checkpoint import CheckpointError
from encoders.hub import ModelResolutionError
from encoders.sentence import SentenceEncoder
from encoders.st_format import write_sentence_transformers_dir
from tests.conftest import ROOT, run_script

SENTENCES = ["A man is playing a guitar.", "Two dogs run in the snow.", "The market fell sharply today."]


@pytest.fixture(scope="module")
def trained_like(tiny_model_dir, tmp_path_factory):
    """An encoder with a trained-looking head (SimCSE's MLP, kept at evaluation) and its checkpoint,
    written with the keys ``SentenceEmbeddingModule.on_save_checkpoint`` writes."""
    torch.manual_seed(1)
    encoder = SentenceEncoder(tiny_model_dir, pooling="cls", mlp_head=True).eval()
    with torch.no_grad():
        for p in encoder.mlp.parameters():
            p.add_(torch.randn_like(p))
    path = tmp_path_factory.mktemp("ckpt") / "run.ckpt"
    torch.save({"encoder_config": dict(encoder.config_dict), "encoder_class": "SentenceEncoder",
                "state_dict": {f"encoder.{k}": v for k, v in encoder.state_dict().items()}}, path)
    return encoder, str(path)


def test_checkpoint_brings_its_pooling_and_trained_head(trained_like):
    encoder, path = trained_like
    loaded = encoders.load(path)
    assert (loaded.pooling, loaded.training) == ("cls", False)
    torch.testing.assert_close(loaded.encode(SENTENCES), encoder.encode(SENTENCES), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="a checkpoint pools as its run did"):
        encoders.load(path, pooling="mean")


def test_sentence_transformers_directory_equals_the_exported_encoder(trained_like, tmp_path):
    encoder, _ = trained_like
    directory = write_sentence_transformers_dir(encoder, str(tmp_path / "st"))
    loaded = encoders.load(str(directory))
    torch.testing.assert_close(loaded.encode(SENTENCES), encoder.encode(SENTENCES), atol=1e-5, rtol=0)


def test_plain_directory_pools_as_asked(tiny_model_dir):
    mean = encoders.load(tiny_model_dir)
    cls = encoders.load(tiny_model_dir, pooling="cls_before_pooler")
    assert (mean.pooling, cls.pooling, mean.training) == ("mean", "cls_before_pooler", False)
    assert not torch.allclose(mean.encode(SENTENCES), cls.encode(SENTENCES))


def test_hub_id_of_the_offline_model_is_its_sentence_transformers_copy():
    loaded = encoders.load("sentence-transformers/all-MiniLM-L6-v2")
    assert loaded.pooling == "mean" and loaded.config_dict["model_name"] == str(hub.verified_offline_copy())


def test_missing_local_path_is_never_a_hub_request(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda endpoint: pytest.fail("the hub was asked"))
    for name in ("models/my-encodr", "./my-encoder", "runs/a/b/best.ckpt"):
        with pytest.raises((ModelResolutionError, CheckpointError), match="no such model directory|not found"):
            encoders.load(name)


def test_directory_without_a_model_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelResolutionError, match=r"not a model directory \(no config.json or modules.json\)"):
        encoders.load(str(tmp_path))


def test_unreachable_hub_without_a_cached_copy_fails_at_once(monkeypatch, tmp_path):
    monkeypatch.setattr(hub, "hub_offline", lambda: False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda endpoint: "huggingface.co: Name or service not known")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache
    monkeypatch.setattr(hub, "_cached_snapshot", lambda repo_id: None)
    start = time.monotonic()
    with pytest.raises(ModelResolutionError) as err:
        encoders.load("bert-base-uncased")
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert "'bert-base-uncased': the Hugging Face hub cannot be reached" in message
    assert "HF_HUB_OFFLINE=1" in message and "offline_" in message and "local path" in message


def test_unreachable_hub_with_a_cached_copy_uses_it(monkeypatch, tiny_model_dir):
    monkeypatch.setattr(hub, "hub_offline", lambda: False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda endpoint: "no route")
    monkeypatch.setattr(hub, "_cached_snapshot", lambda repo_id: tiny_model_dir if repo_id == "org/cached" else None)
    assert hub.resolve_model_name("org/cached") == tiny_model_dir


def _without_hub(**extra: str) -> dict[str, str]:
    """The environment of a user whose hub is unreachable: HF_HUB_OFFLINE unset, and the hub's
    address a closed local port (connection refused at once, as a firewall or no network does)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy")}
    return {**env, "HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.slow
def test_first_tour_command_without_the_hub_is_one_line_in_seconds():
    """The README's first command, hub unreachable: the model is the first hub access."""
    import subprocess
    import sys

    start = time.monotonic()
    result = subprocess.run([sys.executable, "train.py", "--config", "configs/sbert_sts_regression.yaml"], cwd=ROOT,
                            env=_without_hub(), capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert errors[0].startswith("error: model 'bert-base-uncased': the Hugging Face hub cannot be reached")
    assert "HF_HUB_OFFLINE=1" in errors[0] and "offline_" in errors[0]
    assert elapsed < 10, elapsed  # harness/launch.py answers before Lightning's imports


@pytest.mark.slow
def test_hub_data_without_the_hub_is_one_line_in_seconds(tiny_model_dir, tmp_path):
    """A local model with hub data: the data is the first hub access."""
    import subprocess
    import sys

    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "train.py", "--config", "configs/quickstart.yaml", "--trainer.default_root_dir", str(tmp_path),
         "--model.init_args.encoder.init_args.model_name", tiny_model_dir,
         "--data.init_args.train_source", "sentence-transformers/stsb:train"],
        cwd=ROOT, env=_without_hub(), capture_output=True, text=True, timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert errors[0].startswith("error: sentence-transformers/stsb:train: the Hugging Face hub cannot be reached")
    assert "HF_HUB_OFFLINE=1" in errors[0]
    assert time.monotonic() - start < 10


def test_evaluate_names_a_missing_model_directory(tmp_path):
    result = run_script("evaluate.py", "--model", str(tmp_path / "my-encodr"), "--sts_dir", "tests/fixtures/sts")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: no such model directory: {tmp_path / 'my-encodr'}"


def test_the_launch_check_finds_what_a_run_needs_from_the_hub(monkeypatch, tiny_model_dir, tmp_path):
    from harness.launch import hub_error

    monkeypatch.setenv("SENTEMB_DATA", str(tmp_path))  # the data root the offline overlays read
    monkeypatch.setattr(hub, "hub_offline", lambda: False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda endpoint: "no route")
    monkeypatch.setattr(hub, "_cached_snapshot", lambda repo_id: None)
    paper = ["--config", "configs/simcse_unsup.yaml"]
    assert hub_error(paper).startswith("model 'bert-base-uncased': the Hugging Face hub cannot be reached (no route)")
    offline = paper + ["--config", "configs/overlays/offline_wiki.yaml"]
    assert hub_error(offline) is None  # the offline model, local sentences, dev sets from data.sts_dir
    hub_data = offline + ["--data.init_args.train_source", "hf://datasets/o/n/wiki.txt"]
    assert hub_error(hub_data).startswith("hf://datasets/o/n/wiki.txt: the Hugging Face hub cannot be reached")
    assert hub_error(offline + [f"--model.init_args.encoder.init_args.model_name={tiny_model_dir}"]) is None
    monkeypatch.setattr(hub, "hub_offline", lambda: True)
    assert hub_error(paper) is None  # offline: the cache decides, in the run itself


def test_evaluate_check_answers_before_torch_is_imported(monkeypatch, tmp_path):
    """evaluate.py's preflight: a missing model path always, and with the hub unreachable a hub model or
    the hub's STS data, each as the one line; local data and local models pass to the full command line."""
    from datamodules.sts import SENTEVAL_TAR
    from harness import launch

    assert launch.SENTEVAL_TAR == SENTEVAL_TAR  # the copy that spares the preflight the data modules' imports
    monkeypatch.setattr(hub, "hub_offline", lambda: False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda endpoint: "no route")
    monkeypatch.setattr(hub, "_cached_snapshot", lambda repo_id: None)
    check = launch.evaluate_hub_error
    typo = str(tmp_path / "models" / "my-encodr")
    model = tmp_path / "model"  # a local model folder (its config.json is what marks it as one)
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert check(["--model", str(tmp_path), "--sts_dir", "x"]) == \
        f"{tmp_path}: not a model directory (no config.json or modules.json)"
    assert check(["--model", typo, "--sts_dir", "x"]) == f"no such model directory: {typo}"
    assert check(["--model", "bert-base-uncased", "--sts_dir", "tests/fixtures/sts"]).startswith(
        "model 'bert-base-uncased': the Hugging Face hub cannot be reached (no route)")
    assert check(["--model", str(model)]).startswith(f"{SENTEVAL_TAR} (the STS evaluation data): the Hugging "
                                                        "Face hub cannot be reached (no route); give --sts_dir DIR")
    assert check(["--model", str(model), "--tasks=trec", "--transfer_dir", "x"]) is None  # no STS data needed
    assert check(["--model", str(model), "--tasks", "stsb", "--transfer_dir", "x"]) is not None
    assert check(["--model", str(model), "--sts_dir", "tests/fixtures/sts"]) is None
    assert check(["--ckpt_path", "run.ckpt", "--export", "out"]) is None
    monkeypatch.setattr(hub, "hub_offline", lambda: True)
    assert check(["--model", "bert-base-uncased"]) is None  # offline: the cache decides, in the run itself
    assert check(["--model", typo]) == f"no such model directory: {typo}"


@pytest.mark.slow
def test_evaluate_without_the_hub_is_one_line_in_seconds(tmp_path):
    import subprocess
    import sys

    start = time.monotonic()
    result = subprocess.run([sys.executable, "evaluate.py", "--model", "bert-base-uncased", "--sts_dir",
                             "tests/fixtures/sts"], cwd=ROOT, env=_without_hub(), capture_output=True, text=True,
                            timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert errors[0].startswith("error: model 'bert-base-uncased': the Hugging Face hub cannot be reached")
    assert time.monotonic() - start < 10


def test_train_names_a_missing_model_path_before_lightning(tmp_path):
    from harness.launch import hub_error

    (tmp_path / "models").mkdir()
    typo = str(tmp_path / "models" / "my-encodr")
    assert hub_error(["--config", "configs/quickstart.yaml",
                      "--model.init_args.encoder.init_args.model_name", typo]) == f"no such model directory: {typo}"
