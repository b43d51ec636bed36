"""The optimizer choice: AdamW (default, sentence-transformers') or the SBERT paper's Adam without weight
decay; what the SBERT configs say they use; what an export's model card reports."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
import yaml

from encoders.sentence import SentenceEncoder
from harness.export import optimizer_summary
from lightning_modules import STSRegression
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def tiny_encoder(tiny_model_dir):
    return SentenceEncoder(tiny_model_dir, pretrained=False)


def optimizer_of(encoder, **kwargs) -> torch.optim.Optimizer:
    model = STSRegression(encoder, **kwargs)
    model._trainer = SimpleNamespace(estimated_stepping_batches=10)  # configure_optimizers sizes the schedule
    return model.configure_optimizers()["optimizer"]


def test_default_is_adamw_with_weight_decay_off_biases_and_layernorm(tiny_encoder):
    opt = optimizer_of(tiny_encoder)
    assert type(opt) is torch.optim.AdamW
    decays = sorted(g["weight_decay"] for g in opt.param_groups)
    assert decays == [0.0, 0.01]


def test_adam_is_the_papers_without_weight_decay(tiny_encoder):
    opt = optimizer_of(tiny_encoder, optimizer="adam", lr=3e-5)
    assert type(opt) is torch.optim.Adam
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0]
    assert opt.param_groups[0]["lr"] == 0.0  # linear warmup starts at 0 ...
    assert opt.defaults["lr"] == 3e-5  # ... towards the peak lr
    trainable = {id(p) for p in tiny_encoder.parameters() if p.requires_grad}
    assert {id(p) for p in opt.param_groups[0]["params"]} == trainable


def test_unknown_optimizer_is_refused(tiny_encoder):
    with pytest.raises(ValueError, match="optimizer must be 'adamw' or 'adam', got 'sgd'"):
        STSRegression(tiny_encoder, optimizer="sgd")


@pytest.mark.parametrize("config", sorted((ROOT / "configs").glob("sbert_*.yaml")), ids=lambda p: p.name)
def test_sbert_configs_say_which_optimizer_they_use(config):
    text = config.read_text()
    said = re.findall(r"^# optimizer: (adamw|adam)\b", text, flags=re.M)
    assert len(said) == 1, f"{config.name} must state its optimizer in a '# optimizer: ...' comment"
    used = (yaml.safe_load(text)["model"].get("init_args") or {}).get("optimizer", "adamw")
    assert said[0] == used


def test_model_card_optimizer_line():
    assert optimizer_summary({}) == ("AdamW, weight decay 0.01 (not on biases and LayerNorm weights), peak lr 2e-05; "
                                     "linear warmup over 10% of the steps, then a linear schedule")
    assert optimizer_summary({"optimizer": "adam", "lr": 3e-5, "warmup_ratio": 0.05}).startswith(
        "Adam without weight decay (the SBERT paper's), peak lr 3e-05; linear warmup over 5% of the steps")


def test_gradient_clipping_works_with_the_fused_optimizer_under_bf16(tiny_model_dir, fixtures_dir, one_torch_thread):
    """Lightning refuses to clip for a fused optimizer under mixed precision (an fp16 grad-scaler guard); bf16
    has no scaler, so ``trainer.gradient_clip_val`` must work, and clip."""
    import lightning as L

    from datamodules import STSDataModule

    encoder = SentenceEncoder(tiny_model_dir, pretrained=False)
    model = STSRegression(encoder, lr=1.0)  # a huge step: unclipped gradients are far above the limit
    norms = []

    class Norm(L.Callback):
        def on_before_zero_grad(self, trainer, module, optimizer):  # the previous step's grads, as clipped
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            if grads:
                norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

    dm = STSDataModule(str(fixtures_dir / "sts" / "stsb.dev.tsv"), per_device_batch_size=8)
    dm.use_tokenizer(**encoder.tokenization())
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", max_steps=3, gradient_clip_val=1e-3,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                        callbacks=[Norm()], use_distributed_sampler=False)
    trainer.fit(model, datamodule=dm)
    assert len(norms) == 2 and max(norms) <= 1e-3 * 1.01, norms
