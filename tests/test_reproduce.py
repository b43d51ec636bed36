"""experiments/reproduce.py: a paper's two-step protocol run offline on the fixtures, the side-by-side table,
JSON and Markdown written, and a second invocation that reads everything back instead of training again."""
from __future__ import annotations

import json
import statistics
import sys

import pytest
import yaml

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import reproduce  # noqa: E402


def test_every_paper_names_shipped_configs_and_a_consistent_paper_row():
    for name, paper in reproduce.PAPERS.items():
        for _, configs in paper.steps:
            for config in configs:
                assert (ROOT / config).is_file(), (name, config)
        if paper.paper_row is None:
            assert name == "mnr_nli" and "ours only" in paper.note
            continue
        assert "Table" in paper.paper_row.citation
        scores = paper.paper_row.scores
        tasks = [t for t in reproduce.STS_TASKS if t in scores]
        if len(tasks) == len(reproduce.STS_TASKS):
            # a mistyped figure would move the mean away from the paper's own average
            assert statistics.mean(scores[t] for t in tasks) == pytest.approx(scores["avg"], abs=0.05), name


def test_step_targets_and_bad_arguments(tmp_path):
    overlay = tmp_path / "o.yaml"
    overlay.write_text("{}\n")
    out = reproduce.split_targets([str(overlay), f"stsb:{overlay}"], ["nli", "stsb"], "--config")
    assert out == {"nli": [str(overlay)], "stsb": [str(overlay), str(overlay)]}
    out = reproduce.split_targets(["nli:trainer.max_steps=3", "data.init_args.train_source=hf://x/y"],
                                  ["nli", "stsb"], "--set")
    assert out == {"nli": ["trainer.max_steps=3", "data.init_args.train_source=hf://x/y"],
                   "stsb": ["data.init_args.train_source=hf://x/y"]}
    with pytest.raises(reproduce.ReproduceError, match="no step 'wiki'"):
        reproduce.split_targets(["wiki:trainer.max_steps=3"], ["nli", "stsb"], "--set")
    with pytest.raises(reproduce.ReproduceError, match="no such file"):
        reproduce.split_targets([str(tmp_path / "missing.yaml")], ["nli"], "--config")
    with pytest.raises(reproduce.ReproduceError, match="expected KEY=VALUE"):
        reproduce.split_targets(["trainer.max_steps"], ["nli"], "--set")


def test_every_visible_gpu_with_the_papers_global_batch(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert reproduce.device_arguments() == (["--trainer.accelerator", "cpu", "--trainer.devices", "1"], 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert reproduce.device_arguments() == (["--trainer.accelerator", "gpu", "--trainer.devices", "auto"], 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    args, devices = reproduce.device_arguments()
    assert devices == 4 and args[-2:] == ["--trainer.strategy", "ddp"] and "auto" in args
    # SimCSE's 64 sentences over 4 devices: 16 each, the same 64 in-batch candidates once gathered
    assert reproduce.per_device_share(64, 4) == 16 and reproduce.per_device_share(512, 8) == 64
    with pytest.raises(reproduce.ReproduceError, match="batch of 16 does not split over 3 devices"):
        reproduce.per_device_share(16, 3)


@pytest.mark.slow
def test_the_batch_kept_under_ddp_is_the_resolved_configs(tmp_path):
    """SBERT's batch is 16 (the paper's); its config leaves it to the data module's default."""
    command = reproduce.train_command(["configs/sbert_nli_softmax.yaml"], [], [], [], 42, tmp_path / "run")
    assert reproduce.keep_global_batch(command, 2) == ["--data.init_args.per_device_batch_size", "8"]


@pytest.mark.slow
def test_two_step_paper_offline_prints_the_table_writes_results_and_resumes(tmp_path, tiny_model_dir, fixtures_dir,
                                                                             capsys):
    # Every step: the tiny model, a two-step budget with one dev evaluation, the fixture dev sets; each
    # step's training data through a step-targeted overlay, as a user runs the paper offline.
    common = {"validate_first": False,
              "trainer": {"max_steps": 2, "max_epochs": -1, "val_check_interval": 2, "check_val_every_n_epoch": None,
                          "log_every_n_steps": 1, "enable_model_summary": False},
              "model": {"init_args": {"encoder": {"init_args": {"model_name": tiny_model_dir, "max_seq_length": 32}}}},
              "data": {"init_args": {"sts_dir": str(fixtures_dir / "sts"), "per_device_batch_size": 8}}}
    overlays = {"common": common,
                "nli": {"data": {"init_args": {"train_sources": [str(fixtures_dir / "nli" / "train.tsv")]}}},
                "stsb": {"data": {"init_args": {"train_source": str(fixtures_dir / "sts" / "stsb.train.tsv")}}}}
    for name, content in overlays.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(content))
    argv = ["--paper", "sbert_nli_stsb", "--config", str(tmp_path / "common.yaml"),
            "--config", f"nli:{tmp_path / 'nli.yaml'}", "--config", f"stsb:{tmp_path / 'stsb.yaml'}",
            "--sts_dir", str(fixtures_dir / "sts"), "--out", str(tmp_path / "out"), "--seed", "7"]
    assert reproduce.main(argv) == 0
    printed = capsys.readouterr().out
    run = tmp_path / "out" / "sbert_nli_stsb" / "seed7"

    # the side-by-side table: the paper's row, ours, the difference, and the table it is cited from
    result = json.loads((run / "result.json").read_text())
    ours = result["ours"]
    assert "| paper: SBERT-NLI-STSb-base | — | — | — | — | — | 85.35 | — | — |" in printed
    assert f"| ours (seed 7) | {ours['sts12']:.2f} |" in printed
    assert f"| ours - paper | — | — | — | — | — | {ours['stsb'] - 85.35:+.2f} | — | — |" in printed
    assert "Reimers & Gurevych 2019 (Sentence-BERT, EMNLP), Table 2" in printed
    assert result["citation"].endswith("Table 2") and result["paper"] == {**dict.fromkeys(result["paper"]),
                                                                          "stsb": 85.35}
    assert result["difference"]["stsb"] == pytest.approx(ours["stsb"] - 85.35)
    markdown = (run / "result.md").read_text()
    assert "| ours - paper |" in markdown and "Table 2" in markdown
    assert "STS scores on a sample, not SentEval's test sets" in markdown  # the fixtures are not the papers' data
    assert "(SentEval: 4927). The best dev checkpoint of each step:" in markdown  # one sentence, ended once

    # our figures are the harness's on the best dev checkpoint of the second step, which started from the first's
    nli, stsb = result["steps"]["nli"], result["steps"]["stsb"]
    for info in (nli, stsb):
        assert "/checkpoints/best-" in info["best_checkpoint"] and info["monitor"] == "val/stsb_spearman"
    assert f"--model.init_args.encoder.init_args.model_name {nli['best_checkpoint']} " in stsb["command"]
    assert all(info["command"].endswith("--ckpt_path last") for info in (nli, stsb))  # a stopped step resumes
    import encoders
    from harness.sts_eval import evaluate_sts

    encoder = encoders.load(stsb["best_checkpoint"])
    again = evaluate_sts(lambda s: encoder.encode(s, batch_size=64, precision="32"), str(fixtures_dir / "sts"))
    assert ours == {t: pytest.approx(again[t], abs=1e-6) for t in ours}

    # a second invocation trains nothing and evaluates nothing: it reads both back and keeps the files
    stamps = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    assert reproduce.main(argv) == 0
    printed = capsys.readouterr().out
    assert "step nli: finished earlier, not retrained" in printed
    assert "step stsb: finished earlier, not retrained" in printed
    assert "evaluation: read back" in printed and "| ours - paper |" in printed
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == stamps

    # the same folder with another command is refused, not mixed
    with pytest.raises(reproduce.ReproduceError, match="holds a run of another command"):
        reproduce.main([*argv, "--set", "trainer.max_steps=3"])
