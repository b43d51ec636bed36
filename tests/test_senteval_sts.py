"""SentEval's own data folder as the evaluation data: recognised at three levels, read by SentEval's
rules (input line i with gold line i, unscored pairs dropped, SICK's header skipped), scored exactly as
this project's TSV layout, and fetched from the hub as SimCSE's senteval.tar when no folder is given."""
from __future__ import annotations

import io
import json
import os
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import datamodules.sts as sts
from datamodules import DataError
from datamodules.sts import default_sts_dir, load_sts_task, sts_layout
from harness.sts_eval import evaluate_sts
from tests.conftest import run_script

# SentEval's subsets per year, as senteval/sts.py lists them (STS13 without SMT); written out here,
# not taken from the code under test.
SUBSETS = {
    "sts12": ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"],
    "sts13": ["FNWN", "headlines", "OnWN"],
    "sts14": ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"],
    "sts15": ["answers-forums", "answers-students", "belief", "headlines", "images"],
    "sts16": ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"],
}
UNSCORED = "An unscored pair {} of the SemEval file."  # a sentence SentEval never encodes


def tsv_rows(path: Path) -> list[list[str]]:
    return [line.split("\t")[:3] for line in path.read_text().splitlines()[1:]]


def write_both_layouts(root: Path, fixtures: Path) -> tuple[Path, Path, dict[str, int]]:
    """The project's STS fixture written twice: as this project's TSV layout and as a SentEval clone
    (``root/SentEval/data/downstream``), with SentEval's subset names. Returns both folders and the
    scored pairs per task."""
    tsv, down = root / "tsv", root / "SentEval" / "data" / "downstream"
    tsv.mkdir(parents=True)
    counts = {}
    for task, subsets in SUBSETS.items():
        rows = [r for f in sorted(fixtures.glob(f"{task}.*.tsv")) for r in tsv_rows(f)]
        year = down / "STS" / f"{task.upper()}-en-test"
        year.mkdir(parents=True)
        counts[task] = 0
        for k, subset in enumerate(subsets):
            mine = (rows[3 * k:] + rows[:3 * k])[:12]  # each subset its own pairing of the fixture rows
            counts[task] += len(mine)
            (tsv / f"{task}.{subset}.tsv").write_text(
                "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in mine))
            inputs, gold = [f"{a}\t{b}" for a, b, _ in mine], [s for _, _, s in mine]
            for at in (0, 7):  # unscored pairs: an input line with an empty gold line
                inputs.insert(at, f"{UNSCORED.format(f'{task}-{k}-{at}')}\tIt has no gold score.")
                gold.insert(at, "")
            if task == "sts16":  # the official STS16 input files carry source columns after the pair
                inputs = [f"{line}\tsource-a\tsource-b" for line in inputs]
            if subset == "MSRvid":  # SentEval splits sentences on whitespace: extra spaces change nothing
                inputs = [line.replace(" ", "  ") + " " for line in inputs]
            end = "\r\n" if subset == "headlines" else "\n"
            (year / f"STS.input.{subset}.txt").write_text("".join(x + end for x in inputs), newline="")
            (year / f"STS.gs.{subset}.txt").write_text("".join(x + end for x in gold), newline="")
    stsb = down / "STS" / "STSBenchmark"
    stsb.mkdir()
    rows = tsv_rows(fixtures / "stsb.test.tsv")
    (tsv / "stsb.test.tsv").write_text((fixtures / "stsb.test.tsv").read_text())
    (stsb / "sts-test.csv").write_text(
        "".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{s}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(rows)))
    counts["stsb"] = len(rows)
    (down / "SICK").mkdir()
    rows = tsv_rows(fixtures / "sickr.test.tsv")
    (tsv / "sickr.test.tsv").write_text((fixtures / "sickr.test.tsv").read_text())
    (down / "SICK" / "SICK_test_annotated.txt").write_text(
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        + "".join(f"{i + 1}\t{a}\t{b}\t{s}\tNEUTRAL\n" for i, (a, b, s) in enumerate(rows)))
    counts["sickr"] = len(rows)
    return tsv, down, counts


@pytest.fixture()
def layouts(tmp_path, fixtures_dir):
    return write_both_layouts(tmp_path, fixtures_dir / "sts")


class FixedEncoder:
    """A fixed random vector per distinct sentence (seeded by its text), recording what it encodes."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, sentences: list[str]) -> torch.Tensor:
        self.seen.update(sentences)
        vectors = [np.random.default_rng(zlib.crc32(s.encode())).normal(size=8) for s in sentences]
        return torch.tensor(np.stack(vectors), dtype=torch.float32)


def test_senteval_folder_scores_exactly_as_the_tsv_layout(layouts):
    tsv, down, counts = layouts
    encode = FixedEncoder()
    ours = evaluate_sts(encode, str(tsv))
    theirs = evaluate_sts(encode, str(down))
    assert all(np.isfinite(ours[t]) for t in (*SUBSETS, "stsb", "sickr"))
    assert theirs == ours  # every task, the average and every subset, to the last bit
    assert set(theirs["subsets"]["sts12"]) == set(SUBSETS["sts12"])
    assert not [s for s in encode.seen if s.startswith("An unscored pair")]
    assert {t: sum(map(len, load_sts_task(str(down), t).values())) for t in counts} == counts


def test_a_misaligned_gold_file_changes_the_scores(layouts):
    # the equality above is not vacuous: the same lines with the gold shifted by one give other scores
    tsv, down, _ = layouts
    gold = down / "STS" / "STS13-en-test" / "STS.gs.OnWN.txt"
    lines = gold.read_text().splitlines()
    gold.write_text("\n".join(lines[1:] + lines[:1]) + "\n")
    encode = FixedEncoder()
    assert evaluate_sts(encode, str(down), ["sts13"])["sts13"] != evaluate_sts(encode, str(tsv), ["sts13"])["sts13"]


def test_layout_is_recognised_at_every_level(layouts, tmp_path):
    tsv, down, _ = layouts
    for level in (down, down.parent, down.parent.parent):  # data/downstream, data, the SentEval clone
        assert sts_layout(str(level)) == ("senteval", str(down))
    simcse = tmp_path / "SimCSE"
    simcse.mkdir()
    (down.parent.parent).rename(simcse / "SentEval")  # a SimCSE clone carries SentEval as a subfolder
    assert sts_layout(str(simcse)) == ("senteval", str(simcse / "SentEval" / "data" / "downstream"))
    assert sts_layout(str(tsv)) == ("tsv", str(tsv))
    with pytest.raises(DataError, match=r"neither this project's STS layout .* nor SentEval's data folder"):
        sts_layout(str(tmp_path / "SimCSE" / "SentEval" / "data" / "downstream" / "STS" / "STSBenchmark"))


def _edit(path: Path, change) -> Path:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(change(lines)) + "\n")
    return path


@pytest.mark.parametrize("case", ["input_short", "gold_short", "gold_not_a_number", "no_tab", "stsb_fields",
                                  "sick_range", "missing_subset"])
def test_bad_senteval_files_name_the_file_and_line(layouts, case):
    _, down, _ = layouts
    year = down / "STS" / "STS14-en-test"
    inputs, gold = year / "STS.input.images.txt", year / "STS.gs.images.txt"
    n = len(gold.read_text().splitlines())
    task = "sts14"
    if case == "input_short":
        _edit(inputs, lambda lines: lines[:-1])
        expected = f"{inputs}:{n}: no input line for {gold}:{n}"
    elif case == "gold_short":
        _edit(gold, lambda lines: lines[:-2])
        expected = f"{gold}:{n - 1}: no gold line for {inputs}:{n - 1}"
    elif case == "gold_not_a_number":
        _edit(gold, lambda lines: lines[:2] + ["four"] + lines[3:])
        expected = f"{gold}:3: score 'four' is not a number"
    elif case == "no_tab":
        _edit(inputs, lambda lines: lines[:1] + [lines[1].replace("\t", " ")] + lines[2:])
        expected = f"{inputs}:2: expected two sentences separated by a tab"
    elif case == "stsb_fields":
        task, csv = "stsb", down / "STS" / "STSBenchmark" / "sts-test.csv"
        _edit(csv, lambda lines: lines[:1] + ["\t".join(lines[1].split("\t")[:6])] + lines[2:])
        expected = f"{csv}:2: expected at least 7 tab-separated fields, found 6"
    elif case == "sick_range":
        task, sick = "sickr", down / "SICK" / "SICK_test_annotated.txt"
        _edit(sick, lambda lines: lines[:2] + [lines[2].replace("\tNEUTRAL", "").rsplit("\t", 1)[0] + "\t7\tNEUTRAL"]
              + lines[3:])
        expected = f"{sick}:3: score '7' is outside the range [1, 5]"
    else:
        (year / "STS.gs.tweet-news.txt").unlink()
        expected = f"{year / 'STS.gs.tweet-news.txt'}: data file not found"
    with pytest.raises(DataError) as err:
        load_sts_task(str(down.parent.parent), task)
    assert str(err.value).startswith(expected), str(err.value)


def test_evaluate_cli_reads_the_senteval_folder(layouts, tiny_model_dir, tmp_path):
    # the user's path: evaluate.py pointed at a SentEval clone gives what evaluate_sts gives on the TSV layout
    import encoders

    tsv, down, _ = layouts
    out = tmp_path / "r.json"
    result = run_script("evaluate.py", "--model", tiny_model_dir, "--sts_dir", str(down.parent.parent),
                        "--tasks", "sts16,sickr", "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    encoder = encoders.load(tiny_model_dir).eval()
    expected = evaluate_sts(lambda s: encoder.encode(s, batch_size=64), str(tsv), ["sts16", "sickr"])
    data = json.loads(out.read_text())
    assert {t: data[t] for t in ("sts16", "sickr")} == pytest.approx({t: expected[t] for t in ("sts16", "sickr")},
                                                                      abs=1e-6)


# -- no --sts_dir: SimCSE's senteval.tar from the hub ------------------------------------------------
def _tar_of(down: Path, path: Path) -> Path:
    """SimCSE's senteval.tar unpacks into data/downstream/: its top level is STS/, SICK/, ..."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name in ("STS", "SICK"):
            tar.add(down / name, arcname=name)
    return path


def test_hub_archive_is_unpacked_once_checked_and_reused(layouts, tmp_path, monkeypatch):
    tsv, down, counts = layouts
    archive = _tar_of(down, tmp_path / "hub" / "snapshots" / "abc" / "senteval.tar")
    asked = []
    monkeypatch.setattr(sts, "fetch_hub_file", lambda source: asked.append(source) or str(archive))
    monkeypatch.setattr(sts, "SENTEVAL_PAIRS", counts)  # the fixture's own sizes
    folder = default_sts_dir()
    assert asked == ["hf://datasets/princeton-nlp/datasets-for-simcse/senteval.tar"]
    assert Path(folder).resolve().is_relative_to(archive.parent.resolve())
    encode = FixedEncoder()
    assert evaluate_sts(encode, folder) == evaluate_sts(encode, str(tsv))
    assert sorted(p.name for p in archive.parent.iterdir()) == ["senteval.tar", "senteval.tar.unpacked"]

    def no_second_unpack(*args):
        raise AssertionError("unpacked twice")

    monkeypatch.setattr(sts, "_unpack", no_second_unpack)
    assert default_sts_dir() == folder


def test_hub_archive_with_other_sizes_is_refused(layouts, tmp_path, monkeypatch):
    _, down, counts = layouts
    archive = _tar_of(down, tmp_path / "hub" / "senteval.tar")
    monkeypatch.setattr(sts, "fetch_hub_file", lambda source: str(archive))
    with pytest.raises(DataError) as err:
        default_sts_dir()  # the fixture is far smaller than SentEval's tasks
    assert f"sts12 {counts['sts12']} (SentEval: 3108)" in str(err.value)
    assert f"sickr {counts['sickr']} (SentEval: 4927)" in str(err.value)
    assert os.listdir(archive.parent) == ["senteval.tar"]  # nothing half-unpacked is left to be reused


@pytest.mark.parametrize("member", ["../escaped.txt", "/tmp/escaped.txt", "link"])
def test_hub_archive_members_outside_the_folder_are_refused(tmp_path, monkeypatch, member):
    archive = tmp_path / "hub" / "senteval.tar"
    archive.parent.mkdir()
    with tarfile.open(archive, "w") as tar:
        if member == "link":
            info = tarfile.TarInfo("STS/evil")
            info.type, info.linkname = tarfile.SYMTYPE, "../../../escaped.txt"
            tar.addfile(info)
        else:  # TarInfo keeps the name as given (tar.add would strip a leading "/")
            info = tarfile.TarInfo(member)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"x\n"))
    monkeypatch.setattr(sts, "fetch_hub_file", lambda source: str(archive))
    with pytest.raises(DataError, match="would be written outside the folder"):
        default_sts_dir()
    assert not (tmp_path / "escaped.txt").exists() and os.listdir(archive.parent) == ["senteval.tar"]


def test_offline_without_a_cached_archive_is_one_error_line(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    from harness.cli import exit_on_user_error

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # read at each download
    with pytest.raises(SystemExit) as stop:
        exit_on_user_error(default_sts_dir)()  # as evaluate.py's entry point reports it
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: hf://datasets/princeton-nlp/datasets-for-simcse/senteval.tar"), \
        lines
    assert "HF_HUB_OFFLINE=1" in lines[0]
    assert "--sts_dir DIR with this project's TSV layout" in lines[0] and "or with SentEval's data folder" in lines[0]
