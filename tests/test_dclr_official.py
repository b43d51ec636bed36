"""DCLR's official form (RUCAIBox/DCLR) as one preset: the complementary model's trained head from two
dropout passes, the preset's parts, and the official overlay's clipping, cadence and selection."""
from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn

from encoders.sentence import SentenceEncoder
from lightning_modules.dclr import DCLR
from tests.conftest import ROOT
from tests.test_train import SIMCSE_ENCODER, objective_config

SENTENCES = ["a cat sleeps", "dogs run fast", "it rains today", "the band plays"]


def simcse_checkpoint(tmp_path, tiny_model_dir) -> str:
    """A ``*.ckpt`` as train.py writes it for SimCSE: cls pooling, the MLP head used in training only."""
    torch.manual_seed(1)
    encoder = SentenceEncoder(tiny_model_dir, pooling="cls", mlp_head=True, mlp_only_train=True, max_seq_length=32)
    path = tmp_path / "simcse.ckpt"
    torch.save({"encoder_config": dict(encoder.config_dict), "encoder_class": "SentenceEncoder",
                "state_dict": {f"encoder.{k}": v for k, v in encoder.state_dict().items()}}, path)
    return str(path)


def no_dropout(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0


def test_official_complementary_of_a_checkpoint_is_its_trained_mlp_over_cls(tmp_path, tiny_model_dir):
    """The trained head of a SimCSE run of this codebase is encoder.mlp; the transformer's pooler is the
    start model's, frozen by SimCSE training. (Before the preset this returned that pooler's output.)"""
    model = DCLR(SentenceEncoder(tiny_model_dir, **SIMCSE_ENCODER), complementary_model=simcse_checkpoint(
        tmp_path, tiny_model_dir), form="official")
    comp = model.complementary
    assert model.complementary_head == "mlp"
    no_dropout(comp)  # the same vector from both passes, so it can be compared with a hand computation
    features = model.encoder.tokenize(SENTENCES)
    anchors, candidates = model._complementary_views(features)
    with torch.no_grad():
        out = comp.transformer(input_ids=features["input_ids"], attention_mask=features["attention_mask"])
        expected = comp.mlp(out.last_hidden_state[:, 0])  # (B, H) SimCSE's trained MLP over [CLS]
    torch.testing.assert_close(anchors, expected)
    torch.testing.assert_close(candidates, expected)
    assert not torch.allclose(anchors, out.pooler_output, atol=1e-3)


def test_official_complementary_compares_two_dropout_passes(tmp_path, tiny_model_dir):
    model = DCLR(SentenceEncoder(tiny_model_dir, **SIMCSE_ENCODER), complementary_model=simcse_checkpoint(
        tmp_path, tiny_model_dir), form="official")
    features = model.encoder.tokenize(SENTENCES)
    torch.manual_seed(0)
    anchors, candidates = model._complementary_views(features)
    assert not torch.equal(anchors, candidates)  # view 1 against view 2, as z1_fix against z2_fix
    assert not model.complementary.training and all(not p.requires_grad for p in model.complementary.parameters())
    paper = DCLR(SentenceEncoder(tiny_model_dir, **SIMCSE_ENCODER), complementary_model=model.hparams.complementary_model)
    anchors, candidates = paper._complementary_views(features)
    assert anchors is candidates  # the paper form: one eval pass compared with itself


def test_official_preset_expands_to_its_parts(tiny_model_dir):
    paper = DCLR(SentenceEncoder(tiny_model_dir), complementary_model=tiny_model_dir)
    official = DCLR(SentenceEncoder(tiny_model_dir), complementary_model=tiny_model_dir, form="official")
    assert paper._noise(4, 4, 32, torch.device("cpu")).shape == (4, 4, 32)  # one noise set per sentence
    assert official._noise(4, 4, 32, torch.device("cpu")).shape == (4, 32)  # one set shared by the batch
    at_phi = torch.tensor([[0.9, 0.5]])
    assert paper._weights(at_phi, None).tolist() == [[0.0, 1.0]]  # cos >= phi masked
    assert official._weights(at_phi, None).tolist() == [[1.0, 1.0]]  # strict cos/tau > phi/tau keeps it
    features = official.encoder.tokenize(SENTENCES)
    _, paper_logs = paper.training_loss({"sentence": features})
    _, official_logs = official.training_loss({"sentence": features})
    assert "noise_masked_fraction" in paper_logs and "noise_masked_fraction" not in official_logs  # noise never weighted


def test_removed_switches_fail_loudly(tiny_model_dir):
    for switch in ("noise_std", "noise_temperature", "weight_noise", "complementary_mode", "loss", "masked"):
        with pytest.raises(TypeError):
            DCLR(SentenceEncoder(tiny_model_dir), complementary_model=tiny_model_dir, **{switch: None})
    with pytest.raises(ValueError, match="form must be"):
        DCLR(SentenceEncoder(tiny_model_dir), complementary_model=tiny_model_dir, form="offical")


def test_official_overlay_clips_at_one_and_selects_on_the_dev_mean_every_125_steps(tmp_path, tiny_model_dir,
                                                                                    fixtures_dir):
    from harness.cli import SentenceCLI

    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "DCLR", "WikiDataModule",
                              encoder_args=SIMCSE_ENCODER, model_args={"complementary_model": tiny_model_dir})
    cli = SentenceCLI(args=["--config", config, "--config", str(ROOT / "configs" / "dclr" / "official.yaml"),
                            "--trainer.default_root_dir", str(tmp_path / "run")])
    assert cli.trainer.gradient_clip_val == 1.0 and cli.trainer.gradient_clip_algorithm in (None, "norm")  # None: norm
    assert cli.trainer.val_check_interval == 125
    assert cli.trainer.checkpoint_callback.monitor == "val/avg_spearman" and cli.trainer.checkpoint_callback.mode == "max"
    assert cli.model.official


def test_official_fit_clips_the_gradient_norm(tmp_path, tiny_model_dir, fixtures_dir):
    """A short fit of the official form: the clipping hook runs at 1.0 on every step."""
    from harness.cli import SentenceCLI

    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "DCLR", "WikiDataModule",
                              encoder_args=SIMCSE_ENCODER, model_args={"complementary_model": tiny_model_dir})
    cli = SentenceCLI(args=["--config", config, "--config", str(ROOT / "configs" / "dclr" / "official.yaml"),
                            "--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.val_check_interval", "2"])
    seen = []
    original = cli.model.configure_gradient_clipping
    cli.model.configure_gradient_clipping = lambda optimizer, gradient_clip_val=None, gradient_clip_algorithm=None: (
        seen.append(gradient_clip_val), original(optimizer, gradient_clip_val, gradient_clip_algorithm))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert seen and all(v == 1.0 for v in seen)


def test_protocol_overlay_is_one_epoch_with_dev_every_50_steps_and_best_on_the_dev_mean():
    overlay = yaml.safe_load((ROOT / "configs" / "overlays" / "dclr_protocol.yaml").read_text())
    assert overlay["trainer"]["max_epochs"] == 1 and overlay["trainer"]["max_steps"] == -1
    assert overlay["trainer"]["val_check_interval"] == 50
    assert overlay["trainer"]["precision"] == "32"  # fp32: one table across processor families
    assert overlay["checkpoint"]["monitor"] == "val/avg_spearman"
    assert set(overlay["data"]["init_args"]["val_sources"]) == {"stsb", "sickr"}
