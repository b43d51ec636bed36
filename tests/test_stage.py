"""stage.py on local stand-ins of the hub's formats, then a run and an evaluation that read the staged root with
the hub off: the layout it writes is the one its overlay (and the shipped offline overlays) read."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import datasets
import huggingface_hub
import pytest

from datamodules import io, sts
from harness.stage import stage
from tests.conftest import ROOT
from tests.test_senteval_sts import tsv_rows, write_both_layouts
from tests.test_transfer import write_transfer_tasks

SIMCSE = "princeton-nlp/datasets-for-simcse"


def hub_tables(fixtures: Path) -> dict[tuple[str, str], datasets.Dataset]:
    """The hub's datasets as load_dataset returns them: SNLI and MultiNLI with integer class labels (-1: no gold
    label), sentence-transformers/stsb with scores on 0-1."""
    labels = datasets.ClassLabel(names=["entailment", "neutral", "contradiction"])
    rows = [line.split("\t") for line in (fixtures / "nli" / "train.tsv").read_text().splitlines()[1:]]
    ids = {"entailment": 0, "neutral": 1, "contradiction": 2}
    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": labels})
    snli = {"premise": [r[0] for r in rows], "hypothesis": [r[1] for r in rows], "label": [ids[r[2]] for r in rows]}
    snli["premise"].append("A pair without a gold label.")
    snli["hypothesis"].append("It is dropped.")
    snli["label"].append(-1)
    pairs = tsv_rows(fixtures / "sts" / "stsb.dev.tsv")
    return {("snli", "train"): datasets.Dataset.from_dict(snli, features=features),
            ("multi_nli", "train"): datasets.Dataset.from_dict({k: v[:40] for k, v in snli.items()}, features=features),
            ("sentence-transformers/stsb", "validation"): datasets.Dataset.from_dict(
                {"sentence1": [a for a, _, _ in pairs], "sentence2": [b for _, b, _ in pairs],
                 "score": [float(s) / 5 for _, _, s in pairs]})}


@pytest.fixture()
def hub(tmp_path, monkeypatch, fixtures_dir, tiny_model_dir):
    """The hub, answered from local files: its datasets, SimCSE's senteval.tar (STS and transfer tasks in SentEval's
    layout) and wiki1m file, and any model (the tiny BERT)."""
    _, down, counts = write_both_layouts(tmp_path / "hubdata", fixtures_dir / "sts")
    write_transfer_tasks(down)
    stsb = down / "STS" / "STSBenchmark"  # the dev and train splits the real archive also holds
    for split in ("dev", "train"):
        rows = tsv_rows(fixtures_dir / "sts" / f"stsb.{split}.tsv")
        (stsb / f"sts-{split}.csv").write_text(
            "".join(f"main-captions\tMSRvid\t2012{split}\t{i:04d}\t{s}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(rows)))
    rows = tsv_rows(fixtures_dir / "sts" / "sickr.dev.tsv")
    (down / "SICK" / "SICK_trial.txt").write_text(
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        + "".join(f"{i + 1}\t{a}\t{b}\t{s}\tNEUTRAL\n" for i, (a, b, s) in enumerate(rows)))
    archive = tmp_path / "hubfiles" / "senteval.tar"
    archive.parent.mkdir()
    with tarfile.open(archive, "w") as tar:
        for folder in sorted(p.name for p in down.iterdir()):
            tar.add(down / folder, arcname=folder)
    files = {(SIMCSE, "senteval.tar"): archive, (SIMCSE, "wiki1m_for_simcse.txt"): fixtures_dir / "sentences.txt"}
    asked = []

    def download(repo_id, filename, local_files_only=False, **kwargs):
        asked.append(filename)
        return str(files[(repo_id, filename)])

    tables = hub_tables(fixtures_dir)
    monkeypatch.setattr(io, "hf_hub_download", download)
    monkeypatch.setattr(io, "_hub_offline", lambda: False)
    monkeypatch.setattr(io, "_hub_unreachable_reason", lambda endpoint: None)
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, split=None, **kw: tables[(name, split)])
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, local_dir=None, **kw: shutil.copytree(tiny_model_dir, local_dir))
    monkeypatch.setattr(sts, "SENTEVAL_PAIRS", counts)  # the stand-in archive's own sizes
    return {"asked": asked}


def offline_run(*args: str, root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SENTEMB_DATA": str(root), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_staged_root_trains_and_evaluates_with_the_hub_off(hub, tmp_path):
    root = tmp_path / "data root"
    overlay = stage(["--config", "configs/sbert_nli_softmax.yaml"], root)
    # the layout of docs/DATA.md
    snli = (root / "nli" / "snli.train.tsv").read_text().splitlines()
    assert snli[0] == "premise\thypothesis\tlabel" and snli[1].endswith(("\tentailment", "\tneutral", "\tcontradiction"))
    assert not any("without a gold label" in line for line in snli)  # the -1 row is dropped, as in training
    assert (root / "models" / "bert-base-uncased" / "config.json").is_file()
    assert {p.name for p in (root / "sts").glob("*.tsv")} >= {"stsb.dev.tsv", "sickr.dev.tsv", "stsb.test.tsv",
                                                              "sickr.test.tsv", "sts12.MSRpar.tsv"}
    assert {p.name for p in (root / "senteval").iterdir()} == {"MR", "CR", "SUBJ", "MPQA", "SST", "TREC", "MRPC"}
    text = overlay.read_text()
    assert "${SENTEMB_DATA}/nli/snli.train.tsv" in text and "${SENTEMB_DATA}/models/bert-base-uncased" in text
    assert "sts_dir: ${SENTEMB_DATA}/sts" in text and str(root) not in text.split("\n", 3)[-1]  # the root can move
    # a rerun keeps what is there
    stage(["--config", "configs/sbert_nli_softmax.yaml"], root)

    run = offline_run("train.py", "--config", "configs/sbert_nli_softmax.yaml", "--config", str(overlay),
                      "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--validate_first", "false",
                      "--trainer.default_root_dir", str(tmp_path / "runs"), root=root)
    assert run.returncode == 0, run.stderr[-3000:]
    [ckpt] = (tmp_path / "runs").glob("lightning_logs/*/checkpoints/best-*.ckpt")
    scored = offline_run("evaluate.py", "--ckpt_path", str(ckpt), "--sts_dir", "${SENTEMB_DATA}/sts", "--tasks",
                         "stsb,sickr,trec", "--transfer_dir", "${SENTEMB_DATA}/senteval", root=root)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "| STS-B | SICK-R | avg |" in scored.stdout and "TREC" in scored.stdout


def test_a_config_of_a_hub_file_stages_it_as_a_file(hub, tmp_path):
    root = tmp_path / "root"
    overlay = stage(["--config", "configs/simcse_unsup.yaml", "--no_evaluation"], root, evaluation=False)
    assert (root / "wiki" / "wiki1m_for_simcse.txt").read_bytes() == (ROOT / "tests" / "fixtures" /
                                                                       "sentences.txt").read_bytes()
    # with no evaluation sets staged, the hub's STS-B dev split becomes a TSV file on the 0-5 scale
    dev = tsv_rows(root / "sts" / "stsb.validation.tsv")
    original = tsv_rows(ROOT / "tests" / "fixtures" / "sts" / "stsb.dev.tsv")
    assert [(a, b) for a, b, _ in dev] == [(a, b) for a, b, _ in original]
    assert [float(s) for _, _, s in dev] == pytest.approx([float(s) for _, _, s in original], abs=1e-3)
    text = overlay.read_text()
    assert "${SENTEMB_DATA}/wiki/wiki1m_for_simcse.txt" in text and "${SENTEMB_DATA}/sts/stsb.validation.tsv" in text
    assert hub["asked"] == ["wiki1m_for_simcse.txt"]  # from the hub, once


def test_an_unset_data_root_is_one_line_naming_the_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SENTEMB_DATA"}
    run = subprocess.run([sys.executable, "train.py", "--config", "configs/simcse_unsup.yaml", "--config",
                          "configs/overlays/offline_wiki.yaml", "--trainer.default_root_dir", str(tmp_path)],
                         cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: ${SENTEMB_DATA}/wiki/wiki_sentences.txt: SENTEMB_DATA is not set; it is the data root that the "
        "offline overlays read (export SENTEMB_DATA=DIR, a folder in the layout of docs/DATA.md, which stage.py "
        "writes), or give the path itself"]


def _train(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_a_folder_without_a_model_is_named_as_one(tmp_path):
    run = _train("--config", "configs/quickstart.yaml", "--model.init_args.encoder.init_args.model_name", str(tmp_path))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"error: {tmp_path}: not a model directory (no config.json or "
                                               "modules.json)"]


def test_an_uncached_hub_model_offline_names_the_ways_to_get_it(tmp_path):
    run = _train("--config", "configs/quickstart.yaml", "--model.init_args.encoder.init_args.model_name",
                 "nobody/no-such-model", "--trainer.default_root_dir", str(tmp_path), HF_HUB_OFFLINE="1")
    assert run.returncode == 2
    lines = [line for line in run.stderr.strip().splitlines() if line.startswith("error:")]
    assert lines == [run.stderr.strip().splitlines()[-1]]
    assert lines[0].startswith("error: model 'nobody/no-such-model': HF_HUB_OFFLINE is set and the Hugging Face cache "
                               "has no copy; stage it where the hub can be reached (`python stage.py --config CONFIG")
    assert "configs/overlays/offline_*.yaml overlay, or give a local path" in lines[0]


def test_a_run_that_ends_before_its_first_validation_says_so_and_saves(tmp_path, tiny_model_dir, capsys):
    import warnings

    import train

    with warnings.catch_warnings(record=True) as caught:  # the filters in force stay: the CLI's own among them
        cli = train.main(["--config", "configs/quickstart.yaml", "--model.init_args.encoder.init_args.model_name",
                          tiny_model_dir, "--trainer.max_steps", "2", "--trainer.precision", "32", "--validate_first",
                          "false", "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar",
                          "false"])
    out = capsys.readouterr()
    path = cli.trainer.checkpoint_callback.last_model_path
    assert path and os.path.isfile(path)  # the quickstart keeps no last.ckpt otherwise (save_last: false)
    assert (f"the run ended at step 2, before its first validation (none of its val/stsb_spearman figures exist, so "
            f"no best checkpoint); saved {path}") in out.err
    assert f"last checkpoint: {path} (no validation ran, so no best one)" in out.out
    assert not [w for w in caught if "could not find the monitored key" in str(w.message)]


def _stage_without_hub(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "SENTEMB_DATA")}
    return subprocess.run([sys.executable, "stage.py", "--config", "configs/sbert_sts_regression.yaml", "--root",
                           str(tmp_path / "root")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**base, "PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path / "hf"), **env})


def test_staging_offline_names_the_model_and_the_way_forward(tmp_path):
    run = _stage_without_hub(tmp_path, HF_HUB_OFFLINE="1")
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(
        "error: model 'bert-base-uncased': staging downloads from the Hugging Face hub, and HF_HUB_OFFLINE is set here")
    assert "where the hub answers" in lines[0] and "configs/overlays/offline_*.yaml" in lines[0]
    assert "HF_HUB_OFFLINE=0" not in run.stderr


def test_staging_with_the_hub_unreachable_names_the_model_and_the_way_forward(tmp_path):
    run = _stage_without_hub(tmp_path, HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens on port 9
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(
        "error: model 'bert-base-uncased': staging downloads from the Hugging Face hub, which cannot be reached "
        "(127.0.0.1: ")
    assert "where the hub answers" in lines[0] and "configs/overlays/offline_*.yaml" in lines[0]
