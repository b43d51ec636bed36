"""Export to the sentence-transformers format: SentenceTransformer(DIR) reproduces our encode()."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import evaluate
import train
from encoders.checkpoint import encoder_from_checkpoint
from encoders.sentence import SentenceEncoder
from encoders.st_format import check_exportable
from harness.export import export_sentence_transformers
from tests.test_train import objective_config

SENTENCES = [
    "A dog runs in the park.",
    "Cats sleep.",
    "The orchestra performed a long symphony last night, and the audience stood to applaud it for minutes.",
    "word " * 200,  # longer than the tiny model's 128 positions: both sides truncate at the model's maximum
]

POOLINGS = {
    "mean": dict(pooling="mean"),
    "max": dict(pooling="max"),
    "cls_before_pooler": dict(pooling="cls_before_pooler"),
    "cls_mlp_at_eval": dict(pooling="cls", mlp_head=True),
    "cls_mlp_only_train": dict(pooling="cls", mlp_head=True, mlp_only_train=True),
    "mean_projection": dict(pooling="mean", projection_dim=16),  # a linear head kept at evaluation
    "cls_mlp_projection": dict(pooling="cls", mlp_head=True, projection_dim=16),
}


def fake_checkpoint(tmp_path: Path, tiny: str, **encoder_args) -> str:
    """A checkpoint as base.py's on_save_checkpoint and Lightning write it, with a training-only head."""
    torch.manual_seed(1)
    encoder = SentenceEncoder(tiny, max_seq_length=8, **encoder_args)
    state = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    state["classifier.weight"] = torch.randn(3, 3 * encoder.dim)  # NLISoftmax's head, not the encoder's
    state["classifier.bias"] = torch.randn(3)
    run = {"seed_everything": 1, "trainer": {"max_steps": 2, "precision": "32-true"},
           "model": {"class_path": "lightning_modules.NLISoftmax",
                     "init_args": {"encoder": {"class_path": "encoders.SentenceEncoder"}, "lr": 3e-5}},
           "data": {"class_path": "datamodules.NLIDataModule", "init_args": {"train_sources": ["nli/train.tsv"]}}}
    checkpoint = {"state_dict": state, "encoder_config": dict(encoder.config_dict), "global_step": 2,
                  "objective": "lightning_modules.nli_softmax.NLISoftmax", "run_config": yaml.safe_dump(run)}
    path = tmp_path / "run.ckpt"
    torch.save(checkpoint, path)
    return str(path)


@pytest.mark.parametrize("name", list(POOLINGS))
def test_sentence_transformers_reproduces_encode(tmp_path, tiny_model_dir, name):
    from sentence_transformers import SentenceTransformer

    ckpt = fake_checkpoint(tmp_path, tiny_model_dir, **POOLINGS[name])
    out = tmp_path / "exported"
    evaluate.evaluate(ckpt_path=ckpt, export=str(out))

    modules = [m["path"] for m in json.loads((out / "modules.json").read_text())]
    expected = ["", "1_Pooling"]
    expected += ["2_Dense"] if name in ("cls_mlp_at_eval", "cls_mlp_projection") else []
    expected += [f"{len(expected)}_Dense"] if "projection" in name else []
    assert modules == expected
    assert not any("classifier" in k for k in load_file(out / "model.safetensors"))
    card = (out / "README.md").read_text()
    assert "NLISoftmax" in card and "3e-05" in card and "Not evaluated" in card

    encoder, _ = encoder_from_checkpoint(ckpt)
    ours = encoder.encode(SENTENCES, batch_size=3)
    model = SentenceTransformer(str(out), device="cpu")
    theirs = model.encode(SENTENCES, batch_size=3, convert_to_tensor=True)
    assert theirs.shape == ours.shape
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    if name == "cls_mlp_only_train":  # the dropped head really was dropped: CLS state as it is
        cls = encoder.transformer(**encoder.tokenize(SENTENCES[:1], train=False)).last_hidden_state[:, 0]
        torch.testing.assert_close(theirs[:1], cls, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(POOLINGS))
def test_evaluate_model_loads_the_exported_heads(tmp_path, tiny_model_dir, name):
    """evaluate.py --model DIR on an exported directory scores the same model as --ckpt_path:
    Dense heads (SimCSE's MLP, the projection) are loaded, not silently dropped."""
    ckpt = fake_checkpoint(tmp_path, tiny_model_dir, **POOLINGS[name])
    out = tmp_path / "exported"
    evaluate.evaluate(ckpt_path=ckpt, export=str(out))
    expected, _ = encoder_from_checkpoint(ckpt)
    loaded, _ = evaluate.load_encoder(None, str(out), None)
    assert loaded.dim == expected.dim
    torch.testing.assert_close(loaded.encode(SENTENCES, batch_size=3), expected.encode(SENTENCES, batch_size=3),
                               atol=1e-6, rtol=1e-6)


def test_evaluate_model_refuses_unknown_modules(tmp_path, tiny_model_dir, capsys):
    ckpt = fake_checkpoint(tmp_path, tiny_model_dir)
    out = tmp_path / "exported"
    evaluate.evaluate(ckpt_path=ckpt, export=str(out))
    modules = json.loads((out / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})
    (out / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(SystemExit) as exit_info:
        evaluate.evaluate(model=str(out), sts_dir=str(tmp_path))
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "2_LayerNorm" in err and "not supported" in err


def test_refuses_to_overwrite(tmp_path, tiny_model_dir, capsys):
    ckpt = fake_checkpoint(tmp_path, tiny_model_dir)
    out = tmp_path / "exported"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        evaluate.evaluate(ckpt_path=ckpt, export=str(out))
    assert exit_info.value.code == 2
    assert "export directory exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    encoder, _ = encoder_from_checkpoint(ckpt)
    with pytest.raises(FileExistsError):
        export_sentence_transformers(encoder, str(out / "keep.txt"))
    assert not list(tmp_path.glob(".exported.export-*")), "no staging directory is left behind"
    with pytest.raises(ValueError, match="SentenceEncoder models only"):
        check_exportable(torch.nn.Linear(2, 2))


def test_empty_directory_is_used_and_evaluate_needs_a_task(tmp_path, tiny_model_dir):
    ckpt = fake_checkpoint(tmp_path, tiny_model_dir)
    out = tmp_path / "empty"
    out.mkdir()
    evaluate.evaluate(ckpt_path=ckpt, export=str(out))
    assert (out / "modules.json").is_file()
    with pytest.raises(SystemExit):
        evaluate.evaluate(ckpt_path=ckpt)  # neither --sts_dir nor --export


def test_trained_run_exports_with_sts_results(tmp_path, tiny_model_dir, fixtures_dir):
    from sentence_transformers import SentenceTransformer

    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "NLISoftmax", "NLIDataModule",
                              data_args={"view": "labelled"})
    cli = train.main(["--config", config, "--trainer.max_steps", "2", "--validate_first", "false"])
    ckpt = cli.trainer.checkpoint_callback.last_model_path
    out = tmp_path / "exported"
    results = evaluate.evaluate(ckpt_path=ckpt, sts_dir=str(fixtures_dir / "sts"), export=str(out))
    card = (out / "README.md").read_text()
    assert "lightning_modules.NLISoftmax" in card and "Reimers & Gurevych" in card
    assert f"{results['avg']:.2f}" in card and "| STS12 |" in card and "precision 32" in card
    assert "per_device_batch_size" in card and "max_steps" in card  # hyperparameters from run_config
    assert "- Optimizer: AdamW, weight decay 0.01 (not on biases and LayerNorm weights), peak lr 0.001" in card
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 128

    encoder, _ = encoder_from_checkpoint(ckpt)
    theirs = SentenceTransformer(str(out), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    torch.testing.assert_close(theirs, encoder.encode(SENTENCES), atol=1e-5, rtol=1e-5)
