"""evaluate.py's task list: STS and transfer tasks from one SentEval folder, task groups, the JSON keys,
and a model card that says which data its scores come from."""
from __future__ import annotations

import json

import pytest

import evaluate
from datamodules import sts as sts_data
from harness import transfer as tr
from harness.export import evaluation_data_text
from tests.conftest import run_script
from tests.test_senteval_sts import write_both_layouts
from tests.test_transfer import write_transfer_tasks


def test_task_groups_expand_in_order_without_repeats():
    assert evaluate.parse_tasks("transfer") == list(tr.TRANSFER_TASKS)
    assert evaluate.parse_tasks("sts") == list(sts_data.STS_TASKS)
    assert evaluate.parse_tasks("all") == list(sts_data.STS_TASKS) + list(tr.TRANSFER_TASKS)
    assert evaluate.parse_tasks("[stsb, mr, stsb]") == ["stsb", "mr"]
    assert evaluate.parse_tasks(["trec", "sts"])[:2] == ["trec", "sts12"]
    with pytest.raises(ValueError, match=r"--tasks: sst5; choose from .*mrpc or a group: sts, transfer, all"):
        evaluate.parse_tasks("sst2,sst5")


@pytest.fixture()
def senteval_folder(tmp_path, fixtures_dir):
    """One SentEval data folder holding the STS fixture and the transfer tasks, as a SentEval clone has."""
    tsv, down, counts = write_both_layouts(tmp_path, fixtures_dir / "sts")
    write_transfer_tasks(down)
    return tsv, down, counts


def test_sts_and_transfer_tasks_from_one_folder(senteval_folder, tiny_model_dir, tmp_path):
    tsv, down, counts = senteval_folder
    out = tmp_path / "r.json"
    result = run_script("evaluate.py", "--model", tiny_model_dir, "--sts_dir", str(down.parent.parent),
                        "--tasks", "sts16,sst2,mrpc", "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(out.read_text())
    assert {"sts16", "sst2", "mrpc", "mrpc_f1"} <= set(data) and "mr" not in data
    assert "transfer_avg" not in data  # SentEval's transfer average is over all seven tasks only
    assert data["sts_dir"] == str(down.parent.parent) and data["pairs"] == {"sts16": counts["sts16"]}
    # the progress line per task and both tables, as the run prints them
    assert "transfer 1/2 sst2: test acc" in result.stderr and "| model | STS16 | avg |" in result.stdout
    assert "| model | SST2 | MRPC |" in result.stdout
    # the same STS score as the project's TSV layout gives, and the same transfer scores as harness.transfer
    import encoders

    encoder = encoders.load(tiny_model_dir).eval()
    encode = lambda s: encoder.encode(s, batch_size=64)  # noqa: E731
    expected = tr.evaluate_transfer(encode, str(down), ["sst2", "mrpc"], progress=None)
    assert {t: data[t] for t in ("sst2", "mrpc", "mrpc_f1")} == {t: expected[t] for t in ("sst2", "mrpc", "mrpc_f1")}
    again = run_script("evaluate.py", "--model", tiny_model_dir, "--sts_dir", str(tsv), "--tasks", "sts16")
    assert f"{data['sts16']:.2f}" in again.stdout


def test_transfer_tasks_need_senteval_folder(senteval_folder, tiny_model_dir):
    tsv, _, _ = senteval_folder
    result = run_script("evaluate.py", "--model", tiny_model_dir, "--sts_dir", str(tsv), "--tasks", "trec")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {tsv}")


def test_model_card_names_the_data_behind_its_scores():
    sample = {"stsb": 70.0, "sickr": 60.0, "sts_dir": "/data/mine", "pairs": {"stsb": 12, "sickr": 12}}
    text = evaluation_data_text(sample, ["stsb", "sickr"])
    assert text.startswith("STS scores on a sample, not SentEval's test sets, so not comparable")
    assert "`/data/mine`" in text and "stsb 12 (SentEval: 1379)" in text and "sickr 12 (SentEval: 4927)" in text
    full = {**sample, "pairs": {"stsb": 1379, "sickr": 4927}}
    text = evaluation_data_text(full, ["stsb", "sickr"])
    assert text.startswith("SentEval's STS test sets read from `/data/mine` (pairs: stsb 1379, sickr 4927)")
    # results without counts (an older JSON) are not taken for SentEval's sets
    assert "not SentEval's test sets" in evaluation_data_text({"stsb": 70.0}, ["stsb"])


def test_exported_card_holds_both_tables(senteval_folder, tiny_model_dir, tmp_path):
    _, down, _ = senteval_folder
    out = tmp_path / "exported"
    results = evaluate.evaluate(model=tiny_model_dir, sts_dir=str(down), tasks="stsb,sst2", export=str(out))
    card = (out / "README.md").read_text()
    assert "STS scores on a sample, not SentEval's test sets" in card and f"`{down}`" in card
    assert f"| {results['stsb']:.2f} |" in card and "| model | STS-B | avg |" in card
    assert "SentEval's transfer tasks" in card and f"| {results['sst2']:.2f} |" in card


def test_transfer_dir_apart_from_the_sts_data(senteval_folder, tiny_model_dir, tmp_path):
    """STS in the TSV layout and the transfer tasks in SentEval's folder, as ../shared/data holds them;
    transfer tasks alone need no STS data (no hub lookup), and a missing file stops before any encoding."""
    tsv, down, _ = senteval_folder
    both = evaluate.evaluate(model=tiny_model_dir, sts_dir=str(tsv), transfer_dir=str(down), tasks="stsb,trec")
    assert set(both) >= {"stsb", "trec", "sts_dir", "transfer_dir"} and both["transfer_dir"] == str(down)
    alone = evaluate.evaluate(model=tiny_model_dir, transfer_dir=str(down), tasks="trec")
    assert alone["trec"] == both["trec"] and "sts_dir" not in alone
    (down / "TREC" / "TREC_10.label").unlink()
    result = run_script("evaluate.py", "--model", tiny_model_dir, "--transfer_dir", str(down), "--tasks", "trec")
    assert result.returncode == 2 and "Loading weights" not in result.stderr  # before the model is loaded
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {down / 'TREC' / 'TREC_10.label'}: missing")


def test_a_sentence_transformers_pipeline_that_normalizes_gives_unit_vectors(tmp_path, fixtures_dir):
    """all-MiniLM-L6-v2 ends in Normalize: --normalize auto hands the classifiers unit vectors, as
    SentenceTransformer.encode does; --normalize no the raw pooled vectors (the transfer table's two start rows)."""
    import encoders
    from harness.evaluate_cli import evaluate

    assert encoders.load("sentence-transformers/all-MiniLM-L6-v2").pipeline_normalizes is True
    seen = {}
    for normalize in ("auto", "no"):
        out = tmp_path / f"{normalize}.json"
        evaluate(sts_dir=str(fixtures_dir / "sts"), model="sentence-transformers/all-MiniLM-L6-v2", tasks="stsb",
                 output=str(out), normalize=normalize)
        seen[normalize] = json.loads(out.read_text())
    assert seen["auto"]["normalized"] is True and seen["no"]["normalized"] is False
    assert seen["auto"]["stsb"] == pytest.approx(seen["no"]["stsb"], abs=1e-6)  # cosines do not change
