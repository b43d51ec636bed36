"""Hard-negative mining (datamodules/mining.py, mine.py): exact chunked search, the filters, planted
paraphrases, errors naming file and line, and a mined file training MNR with three negatives."""
from __future__ import annotations

import csv

import pytest
import torch

import mine
import train
from datamodules import NLIDataModule
from datamodules.batching import SentenceBatchSampler
from datamodules.io import DataError
from datamodules.mining import MiningSummary, chunked_topk, mine_hard_negatives, select_negatives
from encoders.sentence import SentenceEncoder
from tests.test_train import objective_config

OFFLINE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # the verified offline copy (HF_HUB_OFFLINE=1)


def read_tsv(path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("k", [1, 5, 40])
def test_chunked_search_equals_brute_force(chunk, k):
    g = torch.Generator().manual_seed(0)
    queries, corpus = torch.randn(23, 6, generator=g), torch.randn(31, 6, generator=g)
    scores, ids = chunked_topk(queries, corpus, k, chunk)
    full = (queries @ corpus.T).topk(min(k, 31), dim=1)  # (23, k) the whole score matrix at once
    assert torch.equal(ids, full.indices)
    torch.testing.assert_close(scores, full.values)


def test_filters_on_hand_made_scores():
    # One row, six candidates best first; the positive scores 0.8; candidate 1 is a duplicate (excluded).
    scores = torch.tensor([[0.9, 0.85, 0.79, 0.7, 0.5, 0.1]])
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    excluded = torch.tensor([[False, True, False, False, False, False]])
    summary = MiningSummary()
    chosen, chosen_scores, full = select_negatives(
        scores, ids, excluded, torch.tensor([0.8]), num_negatives=2, range_min=0, range_max=5,
        max_score=0.88, absolute_margin=0.005, relative_margin=0.1, summary=summary)
    # max_score drops 0.9; the absolute margin (> 0.795) none left; the relative margin (> 0.72) drops 0.79
    assert chosen.tolist() == [[13, 14]] and full.tolist() == [True]
    assert chosen_scores[0].tolist() == pytest.approx([0.7, 0.5])
    # seen: the five usable ranks 0..4 (ids 10, 12, 13, 14, 15) and the excluded id 11 before them
    assert summary.candidates == 6
    assert summary.removed == {"positive or duplicate": 1, "rank window": 0, "max_score": 1, "absolute_margin": 0,
                               "relative_margin": 1}
    assert summary.not_sampled == 1  # id 15 passed and was not needed
    # the rank window skips the best usable candidate: ids 12, 13 are then the first two
    chosen, _, _ = select_negatives(scores, ids, excluded, torch.tensor([0.8]), 2, range_min=1, range_max=5)
    assert chosen.tolist() == [[12, 13]]
    # too few pass: the row is marked short
    _, _, full = select_negatives(scores, ids, excluded, torch.tensor([0.8]), 2, 0, 5, max_score=0.3)
    assert full.tolist() == [False]


def test_random_sampling_draws_only_candidates_that_passed():
    scores = torch.linspace(0.9, 0.0, 10).expand(200, 10)  # (200, 10)
    ids = torch.arange(10).expand(200, 10)
    excluded = torch.zeros(200, 10, dtype=torch.bool)
    excluded[:, 0] = True
    g = torch.Generator().manual_seed(0)
    chosen, _, full = select_negatives(scores, ids, excluded, torch.full((200,), 1.0), 3, 0, 8, "random",
                                       max_score=0.75, generator=g)
    assert full.all()
    assert set(chosen.flatten().tolist()) == {2, 3, 4, 5, 6, 7, 8}  # every passing id drawn at some point; 0, 1, 9 never
    assert (chosen.diff(dim=1) > 0).all()  # in rank order, no repeats


def test_relative_margin_removes_planted_paraphrases_that_naive_topk_keeps(tmp_path, fixtures_dir):
    # Six rows come as three planted pairs: each positive has a twin one word apart (a/the, are/is, is/was),
    # the positive of another row, hence a candidate: a false negative.
    source = str(fixtures_dir / "mining" / "pairs.tsv")
    rows = read_tsv(source)
    twins = {rows[i]["positive"]: rows[i ^ 1]["positive"] for i in range(6)}
    naive = mine_hard_negatives([source], OFFLINE_MODEL, str(tmp_path / "naive.tsv"), num_negatives=1,
                                range_max=5, device="cpu")
    aware = mine_hard_negatives([source], OFFLINE_MODEL, str(tmp_path / "aware.tsv"), num_negatives=1,
                                range_max=5, relative_margin=0.05, device="cpu")
    naive_rows, aware_rows = read_tsv(tmp_path / "naive.tsv"), read_tsv(tmp_path / "aware.tsv")
    assert len(naive_rows) == len(aware_rows) == len(rows)
    assert all(r["negative_1"] == twins[r["positive"]] for r in naive_rows if r["positive"] in twins)
    assert not any(r["negative_1"] == twins.get(r["positive"]) for r in aware_rows)
    assert naive.removed["relative_margin"] == 0 and aware.removed["relative_margin"] >= len(twins)
    # what the positive-aware filter keeps scores at most 95 % of its positive
    assert max(aware.relative_scores) <= 0.95 + 1e-6 < max(naive.relative_scores)


def test_positives_and_duplicates_are_never_negatives(tmp_path, tiny_model_dir, fixtures_dir):
    source = str(fixtures_dir / "nli" / "train.tsv")
    out = tmp_path / "mined.tsv"
    summary = mine_hard_negatives([source], tiny_model_dir, str(out), num_negatives=3, range_max=12, chunk_size=5)
    positives: dict[str, set[str]] = {}
    for row in read_tsv(source):
        if row["label"] == "entailment":
            positives.setdefault(row["premise"], set()).add(row["hypothesis"])
    mined = read_tsv(out)
    assert list(mined[0]) == ["anchor", "positive", "negative_1", "negative_2", "negative_3"]
    assert len(mined) == summary.rows_written == sum(len(v) for v in positives.values())
    for row in mined:
        negatives = {row[f"negative_{i}"] for i in (1, 2, 3)}
        assert len(negatives) == 3
        assert not negatives & (positives[row["anchor"]] | {row["anchor"], row["positive"]})
    assert summary.removed["positive or duplicate"] >= summary.rows_written
    assert "removed by relative_margin" in summary.format() and "negative / positive" in summary.format()


def write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def mine_errors(args, capsys) -> list[str]:
    with pytest.raises(SystemExit) as exit_info:
        mine.main(args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def test_bad_input_is_one_error_naming_file_and_line(tmp_path, tiny_model_dir, capsys):
    out = str(tmp_path / "out.tsv")
    empty = write(tmp_path / "pairs.tsv", "anchor\tpositive\na cat\ta kitten\na dog\t \n")
    assert mine_errors(["--inputs", empty, "--model", tiny_model_dir, "--output", out], capsys) == [
        f"error: {empty}:3: empty or missing sentence in column 'positive'"]
    fields = write(tmp_path / "fields.tsv", "anchor\tpositive\na cat\ta kitten\textra\n")
    assert mine_errors(["--inputs", fields, "--model", tiny_model_dir, "--output", out], capsys) == [
        f"error: {fields}:2: expected 2 fields separated by '\\t', found 3"]
    label = write(tmp_path / "nli.tsv", "premise\thypothesis\tlabel\na cat\ta kitten\tentails\n")
    assert mine_errors(["--inputs", label, "--model", tiny_model_dir, "--output", out], capsys) == [
        f"error: {label}:2: label 'entails' is not one of entailment, neutral, contradiction"]
    other = write(tmp_path / "other.tsv", "sentence1\tsentence2\nx\ty\n")
    lines = mine_errors(["--inputs", other, "--model", tiny_model_dir, "--output", out], capsys)
    assert lines[0].startswith(f"error: {other}:1: needs columns anchor, positive")
    tab = write(tmp_path / "tab.jsonl", '{"anchor": "a cat", "positive": "a\\tkitten"}\n')
    assert mine_errors(["--inputs", tab, "--model", tiny_model_dir, "--output", out], capsys)[0].startswith(
        f"error: {tab}:1: the sentence in column 'positive' holds a tab")


def test_bad_options_and_existing_output_fail_before_any_work(tmp_path, tiny_model_dir, fixtures_dir, capsys):
    source = str(fixtures_dir / "nli" / "train.tsv")
    base = ["--inputs", source, "--model", tiny_model_dir, "--output", str(tmp_path / "o.tsv")]
    assert mine_errors(base + ["--num_negatives", "3", "--range_min", "4", "--range_max", "6"], capsys) == [
        "error: --range_max (6) leaves fewer than num_negatives (3) ranks after range_min (4); the smallest valid "
        "range_max is 7"]
    assert mine_errors(base + ["--relative_margin", "1.5"], capsys) == [
        "error: --relative_margin must be in [0, 1), got 1.5"]
    existing = write(tmp_path / "done.tsv", "anchor\tpositive\n")
    assert mine_errors(base[:4] + ["--output", existing], capsys)[0].startswith(f"error: {existing}: already exists")
    assert mine_errors(base[:2] + ["--model", str(tmp_path / "no-model"), "--output", str(tmp_path / "x.tsv")],
                       capsys)[0].startswith("error: no such model directory")


def test_command_line_prints_the_summary(tmp_path, tiny_model_dir, fixtures_dir, capsys):
    out = tmp_path / "mined.tsv"
    mine.main(["--inputs", str(fixtures_dir / "mining" / "pairs.tsv"), "--model", tiny_model_dir, "--output", str(out),
               "--num_negatives", "2", "--sampling", "random", "--max_score", "0.999", "--chunk_size", "4"])
    captured = capsys.readouterr()
    assert "candidates seen:" in captured.out and "removed by max_score:" in captured.out
    assert "mining: searched rows 14/14" in captured.err  # progress on stderr
    assert len(read_tsv(out)) == int(captured.out.split("rows written: ")[1].split(";")[0])


def test_record_keeps_the_summarys_counts_and_quantiles_and_never_overwrites(tmp_path, fixtures_dir, capsys):
    import json

    source = str(fixtures_dir / "mining" / "pairs.tsv")
    options = ["--model", OFFLINE_MODEL, "--num_negatives", "2", "--range_max", "8", "--relative_margin", "0.05",
               "--device", "cpu"]
    folder = tmp_path / "records" / "mining_fixture"
    for run in ("a", "b"):
        mine.main(["--inputs", source, "--output", str(tmp_path / f"{run}.tsv"), *options, "--record", str(folder)])
    capsys.readouterr()
    found = sorted(folder.glob("*.json"))
    assert len(found) == 2  # a second run of the day is a second file
    record = json.loads(found[0].read_text())
    # the same options through the library: the record's figures are its summary's
    summary = mine_hard_negatives(source, OFFLINE_MODEL, str(tmp_path / "c.tsv"), num_negatives=2, range_max=8,
                                  relative_margin=0.05, device="cpu")
    assert record["figures"] == json.loads(json.dumps(summary.figures()))
    assert record["figures"]["removed relative_margin"] == summary.removed["relative_margin"] > 0  # the planted twins
    assert record["figures"]["negative / positive q100"] <= 0.95  # the filter's bound, in the kept scores
    assert record["benchmark"] == "mining_fixture" and record["notes"]["options"]["num_negatives"] == 2
    # a path inside the clone is relative to its root, so the record reads the same wherever the clone lies
    assert record["notes"]["inputs"] == "tests/fixtures/mining/pairs.tsv" and record["notes"]["model"] == OFFLINE_MODEL
    outputs = {json.loads(f.read_text())["notes"]["output"] for f in found}
    assert outputs == {str(tmp_path / "a.tsv"), str(tmp_path / "b.tsv")}  # outside the clone: as given
    # a file where the folder should be: refused before any mining
    taken = write(tmp_path / "taken", "")
    capsys.readouterr()
    lines = mine_errors(["--inputs", source, "--output", str(tmp_path / "d.tsv"), *options, "--record", taken], capsys)
    assert lines == [f"error: --record {taken}: not a folder; give a folder for the summary's records"]
    assert not (tmp_path / "d.tsv").exists()


def test_nli_module_reads_mined_negatives_and_refuses_plain_nli_for_several(tmp_path, tiny_model_dir, fixtures_dir):
    out = tmp_path / "mined.tsv"
    mine_hard_negatives([str(fixtures_dir / "nli" / "train.tsv")], tiny_model_dir, str(out), num_negatives=3,
                        sampling="random", range_max=40)
    encoder = SentenceEncoder(tiny_model_dir, max_seq_length=32)
    dm = NLIDataModule([str(out)], view="triplets", num_negatives=3, per_device_batch_size=4)
    dm.use_tokenizer(**encoder.tokenization())
    dm.unique_sentences = True
    dm.setup("fit")
    assert dm.batch_keys == ("anchor", "positive", "negative_1", "negative_2", "negative_3")
    # The duplicate-free sampler covers every column, negatives included: on 2 devices the global batches
    # hold no sentence twice, except trailing ones of the duplicates that found no place (its contract; a
    # 48-row fixture whose rows share negatives leaves a few).
    rows = dm.train_dataset
    sampler = SentenceBatchSampler([0] * len(rows), 2, drop_last=True, unique_keys=dm.unique_keys(rows),
                                   num_replicas=2, rank=0)
    clean = [len(set(t)) == len(t) for b in sampler.global_batches()
             for t in [[rows[i][c] for i in b for c in dm.batch_keys]]]
    assert clean == sorted(clean, reverse=True) and sum(clean) > len(clean) / 2, clean
    ignoring = SentenceBatchSampler([0] * len(rows), 2, drop_last=True, num_replicas=2, rank=0)
    assert sum(len(set(t)) == len(t) for b in ignoring.global_batches()
               for t in [[rows[i][c] for i in b for c in dm.batch_keys]]) < sum(clean)
    one = NLIDataModule([str(out)], view="triplets")  # one negative: negative_1 is the negative key
    assert one._load_one(str(out)).column_names == ["anchor", "positive", "negative"]
    plain = NLIDataModule([str(fixtures_dir / "nli" / "train.tsv")], view="triplets", num_negatives=3)
    with pytest.raises(DataError, match="train.tsv: an NLI file gives one contradiction per row"):
        plain._load_one(str(fixtures_dir / "nli" / "train.tsv"))


def test_mined_file_trains_mnr_with_three_negatives(tmp_path, tiny_model_dir, fixtures_dir):
    out = tmp_path / "mined.tsv"
    mine_hard_negatives([str(fixtures_dir / "nli" / "train.tsv")], tiny_model_dir, str(out), num_negatives=3,
                        range_max=10)
    seen: list[tuple[str, ...]] = []

    import lightning as L

    class Keys(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(tuple(batch))

    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "MNR", "NLIDataModule",
                              data_args={"train_sources": [str(out)], "view": "triplets", "num_negatives": 3,
                                         "per_device_batch_size": 4})
    cli = train.SentenceCLI(args=["--config", config])
    cli.trainer.callbacks.append(Keys())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 4 and torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    assert seen and all(k == ("anchor", "positive", "negative_1", "negative_2", "negative_3") for k in seen)


def test_help_and_an_unknown_option(tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        mine.main(["--help"])
    assert exit_info.value.code == 0 and "--relative_margin" in capsys.readouterr().out
    lines = mine_errors(["--inputs", "x.tsv", "--modle", tiny_model_dir, "--output", "o.tsv"], capsys)
    assert lines[0].startswith("error: unknown option --modle")


def test_supervised_simcse_and_mnr_rank_every_negative_column(tiny_model_dir):
    import torch.nn.functional as F

    from lightning_modules import MNR, SimCSE

    encoder = SentenceEncoder(tiny_model_dir, max_seq_length=32).eval()
    texts = ["a cat sleeps", "dogs run", "it rains", "a bird sings", "kids play", "the sun sets", "a car stops",
             "we eat rice", "he reads", "she swims", "they dance", "trees grow", "a boat sails", "snow falls",
             "bells ring", "fish swim"]
    batch = {"anchor": encoder.tokenize(texts[0:4]), "positive": encoder.tokenize(texts[4:8])}
    batch.update({f"negative_{i}": encoder.tokenize(texts[4 + 4 * i:8 + 4 * i]) for i in (1, 2)})
    assert SimCSE.accepts_batch_keys(list(batch)) and not SimCSE.accepts_batch_keys(["anchor", "positive"])
    with torch.no_grad():
        a, p, n1, n2 = (F.normalize(encoder(batch[k]), dim=-1) for k in ("anchor", "positive", "negative_1",
                                                                         "negative_2"))
    keys = torch.cat([p, n1, n2])  # (3B, H): every negative column is a candidate of every anchor
    for model, scale in ((SimCSE(encoder, temperature=0.05), 20.0), (MNR(encoder, scale=10.0), 10.0)):
        loss, logs = model.eval().training_loss(batch)
        by_hand = F.cross_entropy(scale * a @ keys.T, torch.arange(4))
        torch.testing.assert_close(loss.detach(), by_hand, rtol=1e-5, atol=1e-6)
    # the second negative column counts: with the first alone the loss differs
    one = {k: v for k, v in batch.items() if k != "negative_2"}
    assert not torch.allclose(MNR(encoder, scale=10.0).eval().training_loss(one)[0].detach(), by_hand)
