"""experiments/film_pairs.py end to end on fixture pairs, and the labelled-pair reading (QQP's columns, STS's rule)."""
from __future__ import annotations

import argparse

import datasets
import pytest

from experiments import film_pairs
from datamodules import io
from datamodules.io import DataError
from datamodules.pairs import load_labelled_pairs, sts_duplicate_pairs

FAST = ["--tfidf_dim", "8", "--encoder_dim", "8", "--steps", "20", "--minibatch", "8", "--k_candidates", "1", "2", "5"]


def fixture_args(fixtures_dir) -> list[str]:
    pairs = fixtures_dir / "pairs"
    return ["--train", str(pairs / "train.tsv"), "--val", str(pairs / "dev.tsv"), "--test", str(pairs / "test.tsv")]


def test_pipeline_on_fixture_pairs_with_the_tiny_model(fixtures_dir, tiny_model_dir, tmp_path, one_torch_thread, capsys):
    out = tmp_path / "result.json"
    result = film_pairs.main(fixture_args(fixtures_dir) + FAST + ["--model", tiny_model_dir, "--output", str(out)])
    methods = [r["method"] for r in result["rows"]]
    name = tiny_model_dir.rstrip("/").split("/")[-1]
    assert methods == ["majority class of train", "TF-IDF cosine, tuned threshold", "TF-IDF kNN, no metric",
                       "M-FILM over TF-IDF (d 8), kNN", f"{name} cosine, tuned threshold", f"{name} kNN, no metric",
                       f"M-FILM over {name} (d 8), kNN"]
    for row in result["rows"]:
        assert 0 <= row["accuracy"] <= 1 and 0 <= row["f1"] <= 1 and row["log_loss"] > 0
    assert result["pairs"] == {"train": {"pairs": 24, "duplicates": 12}, "val": {"pairs": 8, "duplicates": 4},
                               "test": {"pairs": 8, "duplicates": 4}}
    assert result["groups"] == 12 and result["triplets"] == 12 * 2 * 5  # 12 paraphrase pairs, 2 anchors each
    assert "M-FILM fit over TF-IDF" in result["seconds"] and f"M-FILM fit over {name}" in result["seconds"]
    printed = capsys.readouterr().out
    assert "| M-FILM over TF-IDF (d 8), kNN | k = " in printed and "| step | seconds |" in printed
    assert out.exists()
    with pytest.raises(SystemExit):  # never overwritten
        film_pairs.main(fixture_args(fixtures_dir) + FAST + ["--model", "none", "--output", str(out)])


def test_pipeline_tfidf_only_on_sts_files(fixtures_dir, one_torch_thread):
    result = film_pairs.main(["--sts_dir", str(fixtures_dir / "sts"), "--model", "none"] + FAST)
    assert [r["method"] for r in result["rows"]][-1] == "M-FILM over TF-IDF (d 8), kNN"
    assert all(result["pairs"][s]["duplicates"] > 0 for s in ("train", "val", "test"))


@pytest.fixture
def hub_qqp(fixtures_dir, monkeypatch):
    """The hub's nyu-mll/glue qqp split, served from a fixture with QQP's columns and integer labels."""
    local = io.load_source(str(fixtures_dir / "pairs" / "qqp.tsv"))
    local = local.cast_column("label", datasets.Value("int64")).cast_column("idx", datasets.Value("int32"))
    calls = []
    real = datasets.load_dataset

    def fake_load_dataset(name, config=None, split=None, **kwargs):
        if name == "nyu-mll/glue":
            calls.append((name, config, split))
            return local
        return real(name, config, split=split, **kwargs)

    monkeypatch.setattr(io.datasets, "load_dataset", fake_load_dataset)
    return calls


def test_qqp_columns_are_mapped(hub_qqp):
    pairs = load_labelled_pairs("nyu-mll/glue:qqp:train")
    assert hub_qqp == [("nyu-mll/glue", "qqp", "train")]
    assert pairs.label == [1, 0, 1, 0]  # the unlabelled (-1) row is dropped
    assert pairs.sentence1[0] == "The chef is slicing fresh tomatoes in the kitchen."
    assert pairs.sentence2[0] == "In the kitchen a cook cuts up ripe tomatoes."
    assert pairs.sentence1[3] == "Someone kicks a soccer ball over the pitch."


def test_qqp_through_the_command_carves_validation_from_train(hub_qqp, fixtures_dir):
    ns = argparse.Namespace(sts_dir=None, train="nyu-mll/glue:qqp:train", val=None,
                            test=str(fixtures_dir / "pairs" / "test.tsv"), val_fraction=0.25, max_pairs=None, seed=0)
    splits = film_pairs.load_splits(ns)
    assert len(splits["val"].label) == 1 and len(splits["train"].label) == 3
    assert sorted(splits["val"].sentence1 + splits["train"].sentence1) == sorted(load_labelled_pairs(
        "nyu-mll/glue:qqp:train").sentence1)


def test_sts_rule_keeps_only_clear_pairs(tmp_path):
    path = tmp_path / "stsb.x.tsv"
    path.write_text("sentence1\tsentence2\tscore\na\tb\t4.0\nc\td\t3.99\ne\tf\t1.0\ng\th\t1.01\ni\tj\t5\n")
    pairs = sts_duplicate_pairs(str(path))
    assert (pairs.sentence1, pairs.label) == (["a", "e", "i"], [1, 0, 1])


def test_bad_label_names_the_line(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tlabel\na\tb\t1\nc\td\t2\n")
    with pytest.raises(DataError, match=r"pairs.tsv:3: label 2 is not 0 or 1"):
        load_labelled_pairs(str(path))
