import pytest

from datamodules import NLIDataModule, STSDataModule, WikiDataModule
from datamodules.sts import load_sts_pairs
from datamodules.batching import SentenceBatchSampler
from datamodules.io import DataError
from datamodules.nli import load_nli
from encoders.sentence import SentenceEncoder
from lightning_modules.mnr import MNR
from lightning_modules.nli_softmax import NLISoftmax


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_sts_scores_rescaled(fixtures_dir):
    ds = load_sts_pairs(str(fixtures_dir / "sts" / "stsb.dev.tsv"))
    assert 0 <= min(ds["score"]) and max(ds["score"]) <= 1
    sick = load_sts_pairs(str(fixtures_dir / "sts" / "sickr.dev.tsv"))
    raw = [float(l.split("\t")[2]) for l in (fixtures_dir / "sts" / "sickr.dev.tsv").read_text().splitlines()[1:]]
    assert sick["score"] == pytest.approx([(r - 1) / 4 for r in raw])


@pytest.mark.parametrize("content, message", [
    ("sentence1\tsentence2\n" "a\tb\n", r"missing column\(s\) \['score'\]"),
    ("sentence1\tsentence2\tscore\n" "a\tb\t3\n" "c\td\thigh\n", r"x\.tsv:3: score 'high' .* not a number"),
    ("sentence1\tsentence2\tscore\n" "a\tb\t3\n" "\td\t1\n", r"x\.tsv:3: empty or missing sentence in column 'sentence1'"),
    ("sentence1\tsentence2\tscore\n" "a\tb\n", r"x\.tsv:2: expected 3 fields"),
    ("sentence1\tsentence2\tscore\n" "a\tb\t7\n", r"x\.tsv:2: score '7' is outside the range \[0, 5\]"),
    ("", r"x\.tsv: the data file is empty"),
])
def test_bad_sts_files_name_file_and_line(tmp_path, content, message):
    with pytest.raises(DataError, match=message):
        load_sts_pairs(write(tmp_path / "x.tsv", content))


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="data file not found"):
        load_sts_pairs(str(tmp_path / "nope.tsv"))


def test_bom_and_windows_line_ends_accepted(tmp_path):
    path = tmp_path / "w.tsv"
    path.write_bytes("\ufeffsentence1\tsentence2\tscore\r\na \"b\tc\t2.5\r\n".encode("utf-8"))
    ds = load_sts_pairs(str(path))
    assert ds["sentence1"] == ['a "b'] and ds["score"] == [0.5]


def test_nli_label_outside_set(tmp_path):
    path = write(tmp_path / "n.tsv", "premise\thypothesis\tlabel\na\tb\tentailment\nc\td\tmaybe\n")
    with pytest.raises(DataError, match=r"n\.tsv:3: label 'maybe' is not one of"):
        load_nli(path)


def test_nli_views(fixtures_dir, tiny_model_dir):
    source = str(fixtures_dir / "nli" / "train.tsv")
    enc = SentenceEncoder(tiny_model_dir)
    for view, keys in (("labelled", {"sentence1", "sentence2", "label"}), ("pairs", {"anchor", "positive"}),
                       ("triplets", {"anchor", "positive", "negative"})):
        dm = NLIDataModule([source], view=view, per_device_batch_size=4)
        dm.check_objective(NLISoftmax if view == "labelled" else MNR)  # MNR: no sentence twice in a batch
        dm.use_tokenizer(**enc.tokenization())
        dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))
        assert set(batch) == keys
        assert batch[next(iter(dm.text_columns))]["input_ids"].shape[0] == 4
    triplets = dm.train_dataset
    labelled = load_nli(source)
    ent = {(p, h) for p, h, y in zip(labelled["premise"], labelled["hypothesis"], labelled["label"]) if y == 0}
    con = {(p, h) for p, h, y in zip(labelled["premise"], labelled["hypothesis"], labelled["label"]) if y == 2}
    for a, p, n in zip(triplets["anchor"], triplets["positive"], triplets["negative"]):
        assert (a, p) in ent and (a, n) in con


def test_batch_order_follows_the_run_seed_unless_set(fixtures_dir, tiny_model_dir, monkeypatch):
    """seed=None: the batch order is the run's seed's (seed_everything), so seeds 42 and 43 differ in
    data order as well as in dropout; an explicit seed fixes the order whatever the run's seed."""
    import lightning as L

    tokenization = SentenceEncoder(tiny_model_dir).tokenization()

    def order(run_seed, seed=None):
        L.seed_everything(run_seed)
        dm = NLIDataModule([str(fixtures_dir / "nli" / "train.tsv")], view="labelled", per_device_batch_size=2,
                           seed=seed)
        dm.use_tokenizer(**tokenization)
        dm.setup("fit")
        return dm.train_sampler.global_batches()

    assert order(42) == order(42)
    assert order(42) != order(43)
    assert order(42, seed=7) == order(43, seed=7)
    monkeypatch.delenv("PL_GLOBAL_SEED")
    assert NLIDataModule(["x"]).batch_seed == 42  # no run seed: the former fixed default


def test_wiki_empty_line_error_or_skip(tmp_path, tiny_model_dir):
    path = write(tmp_path / "w.txt", "one sentence\n\nanother one\n")
    dm = WikiDataModule(path, per_device_batch_size=2)
    dm.use_tokenizer(**SentenceEncoder(tiny_model_dir).tokenization())
    with pytest.raises(DataError, match=r"w\.txt:2: empty"):
        dm.setup("fit")
    dm = WikiDataModule(path, per_device_batch_size=2, skip_empty=True)
    dm.use_tokenizer(**SentenceEncoder(tiny_model_dir).tokenization())
    dm.setup("fit")
    assert len(dm.train_dataset) == 2


def test_sampler_never_repeats_a_sentence_in_a_batch():
    keys = [(f"s{i % 7}", f"p{i}") for i in range(60)]
    sampler = SentenceBatchSampler([1] * 60, batch_size=5, drop_last=True, unique_keys=keys)
    batches = list(sampler)
    assert len(batches) >= 10
    for batch in batches:
        sentences = [k for i in batch for k in keys[i]]
        assert len(sentences) == len(set(sentences))


def test_sampler_shards_equal_and_disjoint_across_ranks():
    lengths = list(range(50))
    shards = [list(SentenceBatchSampler(lengths, 4, drop_last=True, group_by_length=True, num_replicas=2, rank=r))
              for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == 50 // 8
    seen = [i for shard in shards for batch in shard for i in batch]
    assert len(seen) == len(set(seen)) == 48
    assert all(len(b) == 4 for shard in shards for b in shard)


def test_sampler_length_grouping_reduces_padding():
    import random
    rng = random.Random(0)
    lengths = [rng.randint(5, 100) for _ in range(400)]
    def padding(sampler):
        return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in sampler)
    plain = padding(SentenceBatchSampler(lengths, 16))
    grouped = SentenceBatchSampler(lengths, 16, group_by_length=True)
    assert padding(grouped) < plain / 3
    assert sorted(i for b in grouped for i in b) == list(range(400))


def test_sts_datamodule_batch(fixtures_dir, tiny_model_dir):
    dm = STSDataModule(str(fixtures_dir / "sts" / "stsb.train.tsv"), sts_dir=str(fixtures_dir / "sts"),
                       per_device_batch_size=8)
    dm.use_tokenizer(**SentenceEncoder(tiny_model_dir).tokenization())
    dm.setup("fit")
    assert dm.val_names == ["stsb", "sickr"]
    batch = next(iter(dm.train_dataloader()))
    assert batch["score"].dtype.is_floating_point and batch["sentence1"]["attention_mask"].shape[0] == 8
