"""The SentEval "all" aggregation and the evaluation harness against implementations we did not write."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from encoders.sentence import SentenceEncoder
from harness.sts_eval import aggregate_all, evaluate_sts, senteval_text
from tests.conftest import run_script


def test_all_is_spearman_of_the_concatenation_not_the_mean():
    # Two subsets, each perfectly ranked inside itself, but on different scales: the mean of the
    # per-subset correlations is 100, the "all" correlation over the concatenation is not.
    a = (np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0]))
    b = (np.array([0.7, 0.8, 0.9]), np.array([0.5, 1.5, 2.5]))
    result = aggregate_all({"a": a, "b": b})
    assert result["a"] == pytest.approx(100) and result["b"] == pytest.approx(100)
    expected = spearmanr(np.r_[a[0], b[0]], np.r_[a[1], b[1]]).statistic * 100
    assert result["all"] == pytest.approx(expected)
    assert result["all"] < 99


def test_senteval_whitespace():
    assert senteval_text("  a  b\tc ") == "a b c"


def test_harness_against_scipy_on_fixture_tasks(fixtures_dir):
    rng = np.random.default_rng(0)
    table = {}

    def encode(sentences):
        # a fixed random embedding per distinct sentence, so the cosines are reproducible below
        for s in sentences:
            table.setdefault(s, rng.normal(size=8))
        return torch.tensor(np.stack([table[s] for s in sentences]), dtype=torch.float32)

    results = evaluate_sts(encode, str(fixtures_dir / "sts"), ["sts12", "stsb"])
    rows = [l.split("\t") for f in ("sts12.news.tsv", "sts12.video.tsv")
            for l in (fixtures_dir / "sts" / f).read_text().splitlines()[1:]]
    cos = [float(np.dot(table[r[0]], table[r[1]]) / np.linalg.norm(table[r[0]]) / np.linalg.norm(table[r[1]]))
           for r in rows]
    assert results["sts12"] == pytest.approx(spearmanr(cos, [float(r[2]) for r in rows]).statistic * 100, abs=1e-4)
    assert set(results["subsets"]["sts12"]) == {"news", "video"}
    assert results["avg"] == pytest.approx((results["sts12"] + results["stsb"]) / 2)


def test_stsb_against_sentence_transformers_evaluator(fixtures_dir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator

    from encoders.hub import resolve_model_name

    ours = SentenceEncoder("sentence-transformers/all-MiniLM-L6-v2").eval()
    results = evaluate_sts(lambda s: ours.encode(s), str(fixtures_dir / "sts"), ["stsb"])
    rows = [l.split("\t") for l in (fixtures_dir / "sts" / "stsb.test.tsv").read_text().splitlines()[1:]]
    evaluator = EmbeddingSimilarityEvaluator([r[0] for r in rows], [r[1] for r in rows],
                                             [float(r[2]) / 5 for r in rows], name="stsb-test")
    peer = SentenceTransformer(resolve_model_name("sentence-transformers/all-MiniLM-L6-v2"), device="cpu")
    theirs = evaluator(peer)
    # The fixture repeats some pairs, so Spearman's tie handling can turn float noise between
    # batchings into a few hundredths; the cosines themselves must agree to 1e-5.
    assert results["stsb"] == pytest.approx(theirs["stsb-test_spearman_cosine"] * 100, abs=0.1)
    s1, s2 = [r[0] for r in rows], [r[1] for r in rows]
    ours_cos = torch.nn.functional.cosine_similarity(ours.encode(s1), ours.encode(s2))
    their_cos = torch.nn.functional.cosine_similarity(torch.tensor(peer.encode(s1)), torch.tensor(peer.encode(s2)))
    torch.testing.assert_close(ours_cos, their_cos, atol=1e-5, rtol=0)


def test_evaluate_cli_writes_json_and_never_overwrites(tmp_path, tiny_model_dir, fixtures_dir):
    out = tmp_path / "r.json"
    args = ["evaluate.py", "--model", tiny_model_dir, "--sts_dir", str(fixtures_dir / "sts"), "--output", str(out)]
    result = run_script(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | avg |" in result.stdout
    data = json.loads(out.read_text())
    assert {"sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "avg", "subsets"} <= set(data)
    again = run_script(*args)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert json.loads(out.read_text()) == data


@pytest.mark.parametrize("tasks, expected", [("stsb", ["stsb"]), ("stsb,sickr", ["stsb", "sickr"]),
                                             ("[stsb,sickr]", ["stsb", "sickr"])])
def test_evaluate_cli_task_forms_json_path_and_no_progress_bars(tmp_path, tiny_model_dir, fixtures_dir, tasks, expected):
    sts_dir = tmp_path / "sts"  # files datasets has not cached yet: a load would build (and show) a new split
    shutil.copytree(fixtures_dir / "sts", sts_dir)
    out = tmp_path / "r.json"
    result = run_script("evaluate.py", "--model", tiny_model_dir, "--sts_dir", str(sts_dir), "--tasks", tasks,
                        "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [t for t in ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr") if t in data] == expected
    assert f"results written to {out}" in result.stdout
    output = result.stdout + result.stderr
    assert "Generating" not in output and "tokenizing" not in output, output[-2000:]


def test_evaluate_cli_bad_checkpoint(tmp_path, fixtures_dir):
    bad = tmp_path / "x.ckpt"
    bad.write_bytes(b"not a checkpoint")
    result = run_script("evaluate.py", "--ckpt_path", str(bad), "--sts_dir", str(fixtures_dir / "sts"))
    assert result.returncode == 2 and "x.ckpt: not a readable checkpoint" in result.stderr


def test_each_distinct_sentence_is_encoded_once_with_the_figures_of_encoding_every_pair(fixtures_dir, tiny_model_dir):
    """The deduplicated path against the plain one: every pair's two sentences encoded as they come."""
    encoder = SentenceEncoder(tiny_model_dir).eval()
    calls: list[list[str]] = []

    def counting(sentences):
        calls.append(list(sentences))
        return encoder.encode(sentences)

    tasks = ["sts12", "sts13", "stsb", "sickr"]
    results = evaluate_sts(counting, str(fixtures_dir / "sts"), tasks)
    encoded = [s for call in calls for s in call]
    assert len(encoded) == len(set(encoded))  # no sentence twice, across tasks too
    from datamodules import load_sts_task

    for task in tasks:
        plain = {}
        for subset, pairs in load_sts_task(str(fixtures_dir / "sts"), task).items():
            u = encoder.encode([senteval_text(s) for s in pairs["sentence1"]])
            v = encoder.encode([senteval_text(s) for s in pairs["sentence2"]])
            plain[subset] = (torch.nn.functional.cosine_similarity(u, v).numpy(), np.asarray(pairs["score"]))
            assert set(encoded) >= {senteval_text(s) for s in list(pairs["sentence1"]) + list(pairs["sentence2"])}
        assert results[task] == pytest.approx(aggregate_all(plain)["all"], abs=1e-3)
    assert sum(len(c) for c in calls) < sum(2 * n for n in results["pairs"].values())  # the fixtures repeat sentences


def test_progress_is_a_line_per_task_with_the_time_left(fixtures_dir):
    import io

    stream = io.StringIO()
    before_first_encoding = []

    def encode(sentences):
        if not before_first_encoding:  # what a user has read when the first, longest encoding starts
            before_first_encoding.append(stream.getvalue())
        return torch.randn(len(sentences), 4)

    evaluate_sts(encode, str(fixtures_dir / "sts"), ["sts12", "stsb"], progress=stream)
    lines = stream.getvalue().splitlines()
    assert before_first_encoding[0] == lines[0] + "\n"
    assert re.fullmatch(r"STS: encoding \d+ distinct sentences of 2 task\(s\), sts12 first \(\d+\); a line "
                        r"as each task ends", lines[0])
    assert [l.split(":")[0] for l in lines[1:]] == ["STS 1/2 sts12", "STS 2/2 stsb"]
    assert all("spent, about" in l and "left" in l for l in lines[1:])
