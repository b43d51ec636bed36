"""evaluate.py --truncate_dim: STS (and transfer) scores at each Matryoshka dimension, and an export that records
its dimension so that SentenceTransformer(dir, truncate_dim=D) and this project's loader give the same vectors."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import encoders
import evaluate
from encoders.checkpoint import encoder_from_checkpoint
from harness.sts_eval import evaluate_sts
from tests.test_export import SENTENCES, fake_checkpoint


def test_scores_at_each_dimension_are_those_of_the_truncated_embeddings(tmp_path, tiny_model_dir, fixtures_dir):
    sts_dir = str(fixtures_dir / "sts")
    tasks = "stsb,sickr"
    full = evaluate.evaluate(model=tiny_model_dir, sts_dir=sts_dir, tasks=tasks)
    out = tmp_path / "by_dim.json"
    by_dim = evaluate.evaluate(model=tiny_model_dir, sts_dir=sts_dir, tasks=tasks, truncate_dim=[32, 8],
                               output=str(out))
    assert by_dim["truncate_dims"] == [32, 8] and json.loads(out.read_text())["by_dim"]["8"] == by_dim["by_dim"]["8"]
    assert by_dim["by_dim"]["32"]["avg"] == pytest.approx(full["avg"], abs=1e-9)  # all 32 of 32: no change
    encoder = encoders.load(tiny_model_dir)
    by_hand = evaluate_sts(lambda s: encoder.encode(s)[:, :8], sts_dir, ["stsb", "sickr"])
    assert by_dim["by_dim"]["8"]["stsb"] == pytest.approx(by_hand["stsb"], abs=1e-9)
    assert by_dim["by_dim"]["8"]["avg"] != pytest.approx(full["avg"], abs=1e-3)
    one = evaluate.evaluate(model=tiny_model_dir, sts_dir=sts_dir, tasks=tasks, truncate_dim=8)
    assert one["truncate_dim"] == 8 and one["sickr"] == pytest.approx(by_hand["sickr"], abs=1e-9)


def test_transfer_at_a_dimension_sees_the_truncation(tmp_path, tiny_model_dir, monkeypatch):
    seen = []

    def fake_transfer(encode, data_dir, tasks, progress=None):  # what the classifiers would be given
        seen.append(encode(["a cat", "a dog"]))
        return {"mr": 50.0, "avg": 50.0}

    monkeypatch.setattr("harness.evaluate_cli.evaluate_transfer", fake_transfer)
    monkeypatch.setattr("harness.evaluate_cli.find_downstream", lambda d, t: d)
    monkeypatch.setattr("harness.evaluate_cli.task_paths", lambda d, t: None)
    results = evaluate.evaluate(model=tiny_model_dir, transfer_dir=str(tmp_path), tasks="mr", truncate_dim=[16, 4],
                                normalize="yes")
    assert [e.shape for e in seen] == [(2, 16), (2, 4)]
    assert all(torch.allclose(e.norm(dim=-1), torch.ones(2)) for e in seen)  # normalised after truncation
    assert results["by_dim"]["4"]["transfer_avg"] == 50.0


@pytest.mark.parametrize("args, message", [
    ({"truncate_dim": 64}, "--truncate_dim 64: the embeddings have 32 dimensions; choose 1 to 32"),
    ({"truncate_dim": [16, 16]}, "give positive dimensions, each once"),
    ({"truncate_dim": [16, 8], "export": "EXPORT"}, "--export records one dimension"),
])
def test_bad_dimensions_are_one_error_line(tmp_path, tiny_model_dir, fixtures_dir, capsys, args, message):
    args = {k: (str(tmp_path / "out") if v == "EXPORT" else v) for k, v in args.items()}
    with pytest.raises(SystemExit) as exit_info:
        evaluate.evaluate(model=tiny_model_dir, sts_dir=str(fixtures_dir / "sts"), tasks="stsb", **args)
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0]


@pytest.mark.parametrize("encoder_args", [{}, {"pooling": "cls", "mlp_head": True}], ids=["mean", "cls_mlp"])
def test_export_records_the_dimension_for_sentence_transformers(tmp_path, tiny_model_dir, encoder_args):
    from sentence_transformers import SentenceTransformer

    ckpt = fake_checkpoint(tmp_path, tiny_model_dir, **encoder_args)
    out = tmp_path / "exported"
    evaluate.evaluate(ckpt_path=ckpt, export=str(out), truncate_dim=8)
    assert json.loads((out / "config_sentence_transformers.json").read_text())["truncate_dim"] == 8
    assert "truncate_dim=8" in (out / "README.md").read_text()

    theirs = SentenceTransformer(str(out), device="cpu", truncate_dim=8).encode(SENTENCES, batch_size=3,
                                                                                 convert_to_tensor=True)
    ours = encoders.load(str(out)).encode(SENTENCES, batch_size=3)
    assert theirs.shape == ours.shape == (len(SENTENCES), 8)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    full, _ = encoder_from_checkpoint(ckpt)
    torch.testing.assert_close(ours, full.encode(SENTENCES, batch_size=3)[:, :8], atol=1e-5, rtol=1e-5)
    # normalised after the cut, on both sides
    theirs_unit = SentenceTransformer(str(out), device="cpu", truncate_dim=8).encode(
        SENTENCES, batch_size=3, convert_to_tensor=True, normalize_embeddings=True)
    torch.testing.assert_close(theirs_unit, encoders.load(str(out)).encode(SENTENCES, batch_size=3, normalize=True),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(theirs_unit, F.normalize(ours, dim=-1), atol=1e-5, rtol=1e-5)
    # a truncated export exported again keeps its dimension
    again = tmp_path / "again"
    evaluate.evaluate(model=str(out), export=str(again))
    assert json.loads((again / "config_sentence_transformers.json").read_text())["truncate_dim"] == 8


def test_command_line_takes_one_dimension_or_a_list(tmp_path, tiny_model_dir, fixtures_dir, capsys):
    sts_dir = str(fixtures_dir / "sts")
    evaluate.main(["--model", tiny_model_dir, "--sts_dir", sts_dir, "--tasks", "stsb", "--truncate_dim", "8"])
    assert f"| {tiny_model_dir} [8 dims] |" in capsys.readouterr().out
    evaluate.main(["--model", tiny_model_dir, "--sts_dir", sts_dir, "--tasks", "stsb", "--truncate_dim", "[16,8]"])
    out = capsys.readouterr().out
    assert "| 16 dims |" in out and "| 8 dims |" in out


def test_the_output_names_the_weights_scored_by_a_digest_of_the_weights_not_of_the_file(tmp_path, tiny_model_dir,
                                                                                         fixtures_dir):
    """The records tell a truncation scored on its seed's own checkpoint from one scored on a retraining by this
    digest (docs/results/objectives.md's Matryoshka curve)."""
    ckpt = fake_checkpoint(tmp_path, tiny_model_dir)

    def weights(name: str, **source) -> str:
        out = tmp_path / f"{name}.json"
        evaluate.evaluate(sts_dir=str(fixtures_dir / "sts"), tasks="stsb", output=str(out), **source)
        return json.loads(out.read_text())["weights"]

    # the same encoder at another path, with another training state and another training-only head
    checkpoint = torch.load(ckpt, weights_only=False)
    checkpoint["global_step"] = 7
    checkpoint["state_dict"]["classifier.bias"] += 1.0
    moved = tmp_path / "elsewhere" / "model.ckpt"
    moved.parent.mkdir()
    torch.save(checkpoint, moved)
    first = weights("ckpt", ckpt_path=ckpt)
    assert len(first) == 16 and int(first, 16) >= 0
    assert weights("moved", model=str(moved)) == weights("truncated", ckpt_path=ckpt, truncate_dim=8) == first
    # one value of the encoder moved to the next float32: other weights
    key = next(k for k, v in checkpoint["state_dict"].items() if k.startswith("encoder.") and v.is_floating_point())
    value = checkpoint["state_dict"][key].view(-1)[:1]
    value.copy_(torch.nextafter(value, value + 1))
    torch.save(checkpoint, tmp_path / "changed.ckpt")
    assert weights("changed", ckpt_path=str(tmp_path / "changed.ckpt")) != first
