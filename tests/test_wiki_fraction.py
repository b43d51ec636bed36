"""The ``fraction`` option of the Wikipedia data (DCLR's data-fraction experiment)."""
from __future__ import annotations

import pytest

from datamodules import WikiDataModule
from datamodules.wiki import fraction_rows
from encoders.sentence import SentenceEncoder


def test_fraction_rows_are_nested_sized_and_in_file_order():
    rows = {f: fraction_rows(1000, f, seed=0) for f in (1.0, 0.3, 0.1, 0.03, 0.01, 0.003)}
    assert [len(r) for r in rows.values()] == [1000, 300, 100, 30, 10, 3]
    for r in rows.values():
        assert r == sorted(r) and len(set(r)) == len(r)
    sizes = sorted(rows, reverse=True)
    for big, small in zip(sizes, sizes[1:]):
        assert set(rows[small]) <= set(rows[big])
    assert fraction_rows(1000, 0.1, seed=0) == rows[0.1]
    assert fraction_rows(1000, 0.1, seed=1) != rows[0.1]
    assert fraction_rows(1000, 0.1, seed=0) != list(range(100))  # a random subset, not the first lines
    assert len(fraction_rows(50, 0.001, seed=0)) == 1  # never empty


def _module(path, tiny_model_dir, **kwargs) -> WikiDataModule:
    dm = WikiDataModule(str(path), per_device_batch_size=4, **kwargs)
    dm.use_tokenizer(**SentenceEncoder(tiny_model_dir).tokenization())
    dm.setup("fit")
    return dm


def test_wiki_fraction_trains_on_a_fixed_subset(tmp_path, tiny_model_dir):
    lines = [f"sentence number {i} of the fixture" for i in range(40)]
    path = tmp_path / "wiki.txt"
    path.write_text("\n".join(lines) + "\n")
    full = _module(path, tiny_model_dir)
    assert list(full.train_dataset["sentence"]) == lines
    quarter = _module(path, tiny_model_dir, fraction=0.25)
    kept = list(quarter.train_dataset["sentence"])
    assert len(kept) == 10 and kept == [lines[i] for i in fraction_rows(40, 0.25, 0)]
    assert kept == sorted(kept, key=lines.index)  # file order
    half = list(_module(path, tiny_model_dir, fraction=0.5).train_dataset["sentence"])
    assert set(kept) <= set(half)
    other = list(_module(path, tiny_model_dir, fraction=0.25, fraction_seed=3).train_dataset["sentence"])
    assert other != kept
    assert len(_module(path, tiny_model_dir, fraction=0.5, max_sentences=6).train_dataset) == 6


def test_wiki_fraction_errors(tmp_path, tiny_model_dir):
    path = tmp_path / "wiki.txt"
    path.write_text("".join(f"line {i}\n" for i in range(40)))
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="data.fraction must be in"):
            WikiDataModule(str(path), fraction=bad)
    assert len(_module(path, tiny_model_dir, fraction=0.05).train_dataset) == 2  # round(0.05 x 40)
