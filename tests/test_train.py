"""End-to-end: configs parse, every objective fits, checkpoints round-trip, bad input is answered."""
from __future__ import annotations

import glob
import hashlib
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

import train
from encoders.checkpoint import encoder_from_checkpoint
from harness.cli import SentenceCLI
from tests.conftest import ROOT, run_script

CONFIGS = sorted(glob.glob(str(ROOT / "configs" / "*.yaml")))
# an overlay in configs/<name>/ applies on top of configs/<name>.yaml; configs/overlays/ on the paper configs
CONFIGS += [[str(ROOT / "configs" / f"{Path(o).parent.name}.yaml"), o]
            for o in sorted(glob.glob(str(ROOT / "configs" / "*" / "*.yaml"))) if Path(o).parent.name != "overlays"]
CONFIGS += [[str(ROOT / "configs" / base), *(str(ROOT / "configs" / "overlays" / o) for o in overlays)]
            for base, overlays in [
                ("simcse_unsup.yaml", ["offline_wiki.yaml", "cpu_300_steps.yaml", "start_pooling.yaml"]),
                ("dclr.yaml", ["offline_wiki.yaml", "cpu_300_steps.yaml"]),
                ("sbert_nli_softmax.yaml", ["offline_nli.yaml", "cpu_300_steps.yaml"]),
                ("sbert_triplet.yaml", ["offline_nli.yaml"]), ("mnr_nli.yaml", ["offline_nli.yaml"]),
                ("simcse_sup.yaml", ["offline_nli.yaml"]),
                ("sbert_sts_regression.yaml", ["offline_stsb.yaml", "cpu_300_steps.yaml"])]]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p if isinstance(p, str) else "+".join(Path(f).stem for f in p))
def test_every_shipped_config_parses(config, capsys):
    files = [config] if isinstance(config, str) else config
    with pytest.raises(SystemExit) as exit_info:
        SentenceCLI(args=[arg for f in files for arg in ("--config", f)] + ["--print_config"])
    assert exit_info.value.code in (None, 0)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"].startswith("lightning_modules.")


def objective_config(tmp_path: Path, tiny: str, fixtures: Path, model: str, data: str, **extra) -> str:
    """A small YAML for one objective on the tiny model and the fixture data."""
    data_args = {"per_device_batch_size": 8, "sts_dir": str(fixtures / "sts")}
    if data == "STSDataModule":
        data_args["train_source"] = str(fixtures / "sts" / "stsb.train.tsv")
    elif data == "WikiDataModule":
        data_args["train_source"] = str(fixtures / "sentences.txt")
    else:
        data_args["train_sources"] = [str(fixtures / "nli" / "train.tsv")]
    data_args.update(extra.pop("data_args", {}))
    config = {
        "seed_everything": 1,
        "trainer": {"max_steps": 4, "val_check_interval": 2, "check_val_every_n_epoch": None,
                    "log_every_n_steps": 1,  # an epoch of fixture data is a few steps
                    "default_root_dir": str(tmp_path / "runs"), "enable_progress_bar": False,
                    "enable_model_summary": False, "accelerator": "cpu", "devices": 1},
        "model": {"class_path": f"lightning_modules.{model}",
                  "init_args": {"encoder": {"class_path": "encoders.SentenceEncoder",
                                            "init_args": {"model_name": tiny, "max_seq_length": 32,
                                                          **extra.pop("encoder_args", {})}},
                                "lr": 1e-3, **extra.pop("model_args", {})}},
        "data": {"class_path": f"datamodules.{data}", "init_args": data_args},
    }
    path = tmp_path / f"{model}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


PAIRS = {"data_args": {"view": "pairs"}}
TRIPLETS = {"data_args": {"view": "triplets"}}
SIMCSE_ENCODER = {"pooling": "cls", "mlp_head": True, "mlp_only_train": True}
OBJECTIVES = [
    ("NLISoftmax", "NLIDataModule", {"data_args": {"view": "labelled"}}),
    ("STSRegression", "STSDataModule", {}),
    ("Triplet", "NLIDataModule", {"data_args": {"view": "triplets"}}),
    ("MNR", "NLIDataModule", PAIRS),
    ("MNR", "NLIDataModule", {**TRIPLETS, "model_args": {"symmetric": True}}),
    ("MNR", "NLIDataModule", {**TRIPLETS, "model_args": {"mini_batch_size": 3}}),
    ("SimCSE", "WikiDataModule", {"encoder_args": SIMCSE_ENCODER}),
    ("SimCSE", "NLIDataModule", {**TRIPLETS, "model_args": {"mini_batch_size": 3}}),
    ("DCLR", "WikiDataModule", {"encoder_args": SIMCSE_ENCODER, "model_args": {"complementary_model": "TINY"}}),
    ("DCLR", "WikiDataModule", {"encoder_args": SIMCSE_ENCODER, "model_args": {
        "complementary_model": "TINY", "form": "official"}}),
]
OBJECTIVE_IDS = ["NLISoftmax", "STSRegression", "Triplet", "MNR-pairs", "MNR-hard-negatives-symmetric",
                 "MNR-gradcache", "SimCSE-unsup", "SimCSE-sup-gradcache", "DCLR-paper", "DCLR-official"]


def with_tiny(extra: dict, tiny: str) -> dict:
    """Replace the TINY placeholder (the complementary model) by the tiny model's directory."""
    model_args = {k: (tiny if v == "TINY" else v) for k, v in extra.get("model_args", {}).items()}
    return {**extra, "model_args": model_args}


@pytest.mark.parametrize("model, data, extra", OBJECTIVES, ids=OBJECTIVE_IDS)
def test_short_fit_of_each_objective(tmp_path, tiny_model_dir, fixtures_dir, model, data, extra):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, model, data, **with_tiny(extra, tiny_model_dir))
    cli = train.main(["--config", config])
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.global_step == 4
    assert torch.isfinite(metrics["train/loss"])
    assert {"val/stsb_spearman", "val/sickr_spearman", "val/avg_spearman", "val/uniformity"} <= set(metrics)
    assert Path(cli.trainer.checkpoint_callback.best_model_path).is_file()
    assert (Path(cli.trainer.log_dir) / "config.yaml").is_file()


def test_classifier_head_is_trained(tmp_path, tiny_model_dir, fixtures_dir):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "NLISoftmax", "NLIDataModule",
                              data_args={"view": "labelled"})
    cli = SentenceCLI(args=["--config", config])
    before = cli.model.classifier.weight.detach().clone()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert any(p is cli.model.classifier.weight for g in cli.trainer.optimizers[0].param_groups for p in g["params"])
    assert not torch.allclose(before, cli.model.classifier.weight)
    exported = encoder_from_checkpoint(cli.trainer.checkpoint_callback.last_model_path)[0].state_dict()
    assert not any("classifier" in k for k in exported), "the head is not part of the exported encoder"


def test_frozen_transformer_trains_only_the_head(tmp_path, tiny_model_dir, fixtures_dir):
    """FILM's deep variant (configs/film_deep_triplet.yaml): the triplet objective over a frozen
    transformer with a linear head. The transformer's weights do not move and its dropout stays
    off during training; the head trains and is saved with the run."""
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "Triplet", "NLIDataModule",
                              data_args={"view": "triplets"},
                              encoder_args={"freeze_transformer": True, "projection_dim": 8})
    cli = SentenceCLI(args=["--config", config])
    encoder = cli.model.encoder
    transformer_before = {k: v.detach().clone() for k, v in encoder.transformer.state_dict().items()}
    head_before = encoder.projection.weight.detach().clone()
    modes = []

    class RecordMode(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, *_):
            modes.append((pl_module.encoder.transformer.training, pl_module.encoder.projection.training))

    cli.trainer.callbacks.append(RecordMode())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert modes and all(m == (False, True) for m in modes), modes
    for name, value in encoder.transformer.state_dict().items():
        torch.testing.assert_close(value, transformer_before[name], rtol=0, atol=0, msg=name)
    assert not torch.allclose(encoder.projection.weight, head_before)
    trainable = {id(p) for g in cli.trainer.optimizers[0].param_groups for p in g["params"]}
    assert trainable == {id(p) for p in encoder.projection.parameters()}
    restored, _ = encoder_from_checkpoint(cli.trainer.checkpoint_callback.last_model_path)
    assert restored.dim == 8
    torch.testing.assert_close(restored.projection.weight, encoder.projection.weight)


def test_checkpoint_round_trip_gives_identical_embeddings(tmp_path, tiny_model_dir, fixtures_dir):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule")
    cli = train.main(["--config", config])
    sentences = ["A dog runs in the park.", "The weather is cold today.", "Cats sleep."]
    expected = cli.model.encoder.encode(sentences)
    encoder, checkpoint = encoder_from_checkpoint(cli.trainer.checkpoint_callback.last_model_path)
    assert checkpoint["objective"].endswith("STSRegression") and "run_config" in checkpoint
    torch.testing.assert_close(encoder.encode(sentences), expected, rtol=0, atol=0)


def test_config_typo_fails_naming_the_key():
    result = run_script("train.py", "--config", "configs/quickstart.yaml", "--trainer.max_stepz", "3")
    assert result.returncode != 0 and "max_stepz" in result.stderr


def test_config_wrong_type_fails_naming_the_key():
    result = run_script("train.py", "--config", "configs/quickstart.yaml", "--trainer.max_steps", "many")
    assert result.returncode != 0 and "max_steps" in result.stderr


@pytest.mark.parametrize("override, message", [
    (["--data.init_args.train_source", "no/such/file.tsv"], "no/such/file.tsv: data file not found"),
    (["--model.init_args.encoder.init_args.model_name", "./no-such-model"], "no such model directory: ./no-such-model"),
])
def test_bad_input_ends_with_one_clear_message(tmp_path, override, message):
    result = run_script("train.py", "--config", "configs/quickstart.yaml", "--trainer.default_root_dir",
                        str(tmp_path), *override)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: {message}" or message in result.stderr
    assert "Traceback" not in result.stderr


def test_failed_run_keeps_earlier_checkpoints(tmp_path, tiny_model_dir, fixtures_dir):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule")
    train.main(["--config", config])
    files = sorted(glob.glob(str(tmp_path / "runs" / "**" / "*.ckpt"), recursive=True))
    digests = {f: hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files}
    with pytest.raises(SystemExit):
        train.main(["--config", config, "--data.init_args.sts_dir", str(tmp_path / "missing")])
    assert {f: hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files} == digests


@pytest.mark.slow
def test_two_process_ddp_fit_on_cpu(tmp_path, tiny_model_dir, fixtures_dir):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule")
    result = run_script("train.py", "--config", config, "--trainer.strategy", "ddp", "--trainer.devices", "2",
                        "--trainer.accelerator", "cpu", timeout=600)
    assert result.returncode == 0, result.stderr[-6000:]
    assert glob.glob(str(tmp_path / "runs" / "**" / "last.ckpt"), recursive=True)


def test_validation_scores_each_dev_pair_from_its_distinct_sentences(tiny_model_dir, fixtures_dir):
    """The dev figures from each distinct sentence encoded once equal Spearman over every pair encoded."""
    import lightning as L
    from scipy.stats import spearmanr

    from datamodules import STSDataModule
    from datamodules.scored import load_sts_pairs
    from encoders.sentence import SentenceEncoder
    from lightning_modules import STSRegression

    encoder = SentenceEncoder(tiny_model_dir)
    module = STSRegression(encoder=encoder)
    dm = STSDataModule(train_source=str(fixtures_dir / "sts" / "stsb.train.tsv"), sts_dir=str(fixtures_dir / "sts"),
                       eval_batch_size=3)
    dm.use_tokenizer(**encoder.tokenization())
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    found = trainer.validate(module, datamodule=dm, verbose=False)[0]
    for name in ("stsb", "sickr"):
        pairs = load_sts_pairs(str(fixtures_dir / "sts" / f"{name}.dev.tsv"))
        dev = dm.dev_sets[name]
        assert len(dev.sentences) < 2 * len(pairs)  # the fixtures repeat sentences
        u, v = encoder.encode(list(pairs["sentence1"])), encoder.encode(list(pairs["sentence2"]))
        expected = spearmanr(torch.nn.functional.cosine_similarity(u, v).numpy(), pairs["score"]).statistic * 100
        assert found[f"val/{name}_spearman"] == pytest.approx(expected, abs=1e-3)
    assert found["val/avg_spearman"] == pytest.approx((found["val/stsb_spearman"] + found["val/sickr_spearman"]) / 2)


# -- silent acceptance: one warning line each ----------------------------------------------------------------
def test_more_cpu_processes_than_cores_is_warned(tmp_path, tiny_model_dir, fixtures_dir, monkeypatch, capsys):
    from harness.cli import usable_cores

    monkeypatch.setattr(L.Trainer, "fit", lambda *a, **k: None)  # the warning comes before any process starts
    monkeypatch.setattr(L.Trainer, "validate", lambda *a, **k: None)
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule")
    cores = usable_cores()
    train.main(["--config", config, "--trainer.devices", str(cores + 2), "--trainer.strategy", "ddp"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: --trainer.devices {cores + 2} starts {cores + 2} training processes on {cores} "
                        f"CPU core(s): they take turns on the cores, so the run is slower than with "
                        f"--trainer.devices {cores}"]
    train.main(["--config", config, "--trainer.devices", str(cores)])
    assert "warning:" not in capsys.readouterr().err


@pytest.mark.parametrize("scheduler, warned", [("linear", True), ("constant_with_warmup", False)])
def test_a_continuation_that_moves_the_schedule_is_warned(tmp_path, tiny_model_dir, fixtures_dir, capsys, scheduler,
                                                          warned):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule",
                              model_args={"scheduler": scheduler})
    train.main(["--config", config, "--trainer.max_steps", "2"])
    (last,) = glob.glob(str(tmp_path / "runs" / "**" / "last.ckpt"), recursive=True)
    capsys.readouterr()
    train.main(["--config", config, "--trainer.max_steps", "2", "--ckpt_path", last])  # the same length: no word
    assert "warning:" not in capsys.readouterr().err
    train.main(["--config", config, "--trainer.max_steps", "4", "--ckpt_path", last])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    if warned:
        assert len(warnings) == 1 and warnings[0].startswith(f"warning: {last}: trainer.max_steps 2 -> 4: the linear "
                                                              "learning-rate schedule spans the run's total steps")
    else:
        assert warnings == []


def test_a_scalar_logged_at_some_steps_only_is_warned(tmp_path, tiny_model_dir, fixtures_dir, one_torch_thread):
    """Lightning writes a step scalar's last value again at every later logged step where it was not logged, so
    a figure logged only at some steps reads as if every step had it; the base module warns of such a scalar."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from datamodules import STSDataModule
    from encoders.sentence import SentenceEncoder
    from lightning_modules.sts_regression import STSRegression

    class FirstStepOnly(STSRegression):
        def training_loss(self, batch):
            loss, logs = super().training_loss(batch)
            if self.global_step == 0:
                logs["rare"] = torch.tensor(7.0)
            return loss, logs

    encoder = SentenceEncoder(tiny_model_dir, pretrained=False)
    dm = STSDataModule(str(fixtures_dir / "sts" / "stsb.dev.tsv"), per_device_batch_size=8)
    dm.use_tokenizer(**encoder.tokenization())
    trainer = L.Trainer(accelerator="cpu", max_steps=3, log_every_n_steps=1, logger=CSVLogger(tmp_path),
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False)
    with pytest.warns(UserWarning, match=r"logged train/rare at an earlier training step but not at step 1") as seen:
        trainer.fit(FirstStepOnly(encoder), datamodule=dm)
    assert sum("train/rare" in str(w.message) for w in seen) == 1  # once, not at every later step
    rows = list(csv.DictReader(open(glob.glob(str(tmp_path / "**" / "metrics.csv"), recursive=True)[0])))
    rare = [r["train/rare"] for r in rows if r["train/loss"]]
    assert rare == ["7.0", "7.0", "7.0"]  # what the warning is about: steps 1 and 2 repeat step 0's value
