"""The padding-free encoder path (encoders/unpadded.py) against the padded Hugging Face forward.

Tolerances: fp32 embeddings within 1e-5 (absolute and relative); fp32 loss within 1e-6 and every
parameter's gradient within 1e-5 absolute + 1e-4 relative (the two paths sum the same products in a
different order); under bf16 autocast embeddings within 2e-2 absolute + 2e-2 relative and gradients
within 5e-3 absolute + 5e-2 relative (bf16 keeps 8 bits of mantissa, a relative step of 7.8e-3).
"""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from encoders.sentence import POOLINGS, SentenceEncoder
from encoders.unpadded import Packing, family, packed_forward
from lightning_modules.losses import info_nce_loss

SENTENCES = ["A dog runs in the park.", "Cats sleep.", "Hi",
             "The orchestra performed a long symphony last night, and the audience stayed to the end.",
             "Two men are playing chess in a sunny garden.", "A woman slices a tomato."]
POSITIVES = ["A dog is outside.", "Animals rest.", "Hello", "Music was played for a long time.",
             "People play a board game.", "Someone cuts vegetables in a kitchen."]


@pytest.fixture(params=["bert", "roberta"])
def model_dir(request, tiny_model_dir, tiny_roberta_dir):
    return {"bert": tiny_model_dir, "roberta": tiny_roberta_dir}[request.param]


def both(enc: SentenceEncoder, features: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(padding-free, padded) embeddings of one batch from the same weights."""
    enc.padding_free = True
    free = enc(features)
    enc.padding_free = False
    padded = enc(features)
    enc.padding_free = True
    return free, padded


def dropout_off(enc: SentenceEncoder) -> SentenceEncoder:
    """Train mode without dropout: both paths become deterministic, so gradients compare."""
    enc.train()
    for module in enc.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return enc


def loss_and_grads(enc: SentenceEncoder, padding_free: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """An MNR (InfoNCE, scale 20) step on SENTENCES -> POSITIVES: the loss and every gradient."""
    enc.padding_free = padding_free
    enc.zero_grad(set_to_none=True)
    anchors, positives = enc(enc.tokenize(SENTENCES)), enc(enc.tokenize(POSITIVES))  # (B, H) each
    loss, _ = info_nce_loss(anchors, positives, torch.arange(len(SENTENCES)), scale=20.0)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}
    enc.padding_free = True
    return loss.detach(), grads


def test_on_by_default_for_bert_and_roberta(tiny_model_dir, tiny_roberta_dir):
    assert SentenceEncoder(tiny_model_dir).padding_free
    assert SentenceEncoder(tiny_roberta_dir).padding_free
    assert not SentenceEncoder(tiny_model_dir, padding_free=False).padding_free


@pytest.mark.parametrize("pooling", POOLINGS)
def test_embeddings_equal_padded_fp32(model_dir, pooling, one_torch_thread):
    enc = SentenceEncoder(model_dir, pooling=pooling).eval()
    features = enc.tokenize(SENTENCES)
    assert (features["attention_mask"] == 0).any(), "the batch must hold padding for the test to mean anything"
    free, padded = both(enc, features)
    torch.testing.assert_close(free, padded, atol=1e-5, rtol=1e-5)


def test_mlp_head_and_projection_equal_padded(tiny_model_dir, one_torch_thread):
    enc = SentenceEncoder(tiny_model_dir, pooling="cls", mlp_head=True, projection_dim=8)
    dropout_off(enc)  # the head runs in training
    free, padded = both(enc, enc.tokenize(SENTENCES))
    assert free.shape == (len(SENTENCES), 8)
    torch.testing.assert_close(free, padded, atol=1e-5, rtol=1e-5)


def test_roberta_positions_restart_per_sequence(tiny_roberta_dir, one_torch_thread):
    """A sentence alone and the same sentence in a padded batch: same positions, same vector."""
    enc = SentenceEncoder(tiny_roberta_dir, pooling="mean").eval()
    alone = enc(enc.tokenize(SENTENCES[1:2]))
    in_batch = enc(enc.tokenize(SENTENCES))[1:2]
    torch.testing.assert_close(alone, in_batch, atol=1e-5, rtol=1e-5)


def test_packing_round_trip():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    packing = Packing.from_mask(mask)
    assert packing.lengths.tolist() == [3, 1, 4] and packing.starts.tolist() == [0, 3, 4]
    assert packing.seq.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    x = torch.arange(12.0).view(3, 4, 1)  # (B, L, 1)
    packed = packing.pack(x)  # (N, 1)
    assert packed.squeeze(1).tolist() == [0, 1, 2, 4, 8, 9, 10, 11]
    assert torch.equal(packing.unpack(packed, fill=-1.0), x.masked_fill(mask.unsqueeze(-1) == 0, -1.0))


def test_packed_tokens_equal_padded_last_hidden_state(model_dir, one_torch_thread):
    enc = SentenceEncoder(model_dir).eval()
    features = enc.tokenize(SENTENCES)
    with torch.no_grad():
        tokens, packing = packed_forward(enc.transformer, features["input_ids"], features["attention_mask"])
        padded = enc.transformer(**features).last_hidden_state  # (B, L, H)
    assert tokens.shape == (int(features["attention_mask"].sum()), padded.shape[-1])
    torch.testing.assert_close(tokens, packing.pack(padded), atol=1e-5, rtol=1e-5)


def test_loss_and_gradients_equal_padded_fp32(model_dir, one_torch_thread):
    enc = dropout_off(SentenceEncoder(model_dir, pooling="mean"))
    loss_free, grads_free = loss_and_grads(enc, padding_free=True)
    loss_padded, grads_padded = loss_and_grads(enc, padding_free=False)
    torch.testing.assert_close(loss_free, loss_padded, atol=1e-6, rtol=1e-6)
    assert grads_free.keys() == grads_padded.keys()
    assert "transformer.embeddings.position_embeddings.weight" in grads_free
    for name, grad in grads_padded.items():
        torch.testing.assert_close(grads_free[name], grad, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_bf16_autocast_close_to_padded(model_dir, one_torch_thread):
    enc = SentenceEncoder(model_dir, pooling="mean").eval()
    features = enc.tokenize(SENTENCES)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        free, padded = both(enc, features)
    torch.testing.assert_close(free.float(), padded.float(), atol=2e-2, rtol=2e-2)
    dropout_off(enc)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_free, grads_free = loss_and_grads(enc, padding_free=True)
        loss_padded, grads_padded = loss_and_grads(enc, padding_free=False)
    torch.testing.assert_close(loss_free, loss_padded, atol=2e-2, rtol=2e-2)
    for name, grad in grads_padded.items():
        torch.testing.assert_close(grads_free[name], grad, atol=5e-3, rtol=5e-2, msg=lambda m, n=name: f"{n}: {m}")


def test_dropout_acts_in_training_like_padded(tiny_model_dir, one_torch_thread):
    """Same dropout distribution: the spread of training-mode vectors around the eval-mode ones is the
    padded model's (20 draws each; bitwise equality is not expected, the random draws differ)."""
    enc = SentenceEncoder(tiny_model_dir, pooling="mean").eval()
    features = enc.tokenize(SENTENCES)
    with torch.no_grad():
        clean = enc(features)
        enc.train()
        spread = {}
        for padding_free in (True, False):
            enc.padding_free = padding_free
            torch.manual_seed(0)
            spread[padding_free] = torch.stack([enc(features) - clean for _ in range(20)]).pow(2).mean().item()
    assert spread[True] > 0, "dropout must be on in training"
    assert 0.8 < spread[True] / spread[False] < 1.25, spread


def test_encode_equal_padded(tiny_roberta_dir, one_torch_thread):
    enc = SentenceEncoder(tiny_roberta_dir)
    free = enc.encode(SENTENCES + POSITIVES, batch_size=4)
    enc.padding_free = False
    torch.testing.assert_close(free, enc.encode(SENTENCES + POSITIVES, batch_size=4), atol=1e-5, rtol=1e-5)
    assert enc.training, "encode restores training mode"


def test_unknown_architecture_falls_back_with_one_log_line(tiny_distilbert_dir, caplog, one_torch_thread):
    with caplog.at_level(logging.INFO, logger="encoders.sentence"):
        enc = SentenceEncoder(tiny_distilbert_dir, pooling="mean")
    lines = [r for r in caplog.records if "padding-free" in r.getMessage()]
    assert len(lines) == 1 and "DistilBertModel" in lines[0].getMessage() and lines[0].levelno == logging.INFO
    assert family(enc.transformer) is None and not enc.padding_free
    enc.eval()
    features = enc.tokenize(SENTENCES)
    out = enc.transformer(**features).last_hidden_state  # (B, L, H)
    m = features["attention_mask"].unsqueeze(-1).float()
    torch.testing.assert_close(enc(features), (out * m).sum(1) / m.sum(1))
    with pytest.raises(ValueError, match="DistilBertModel"):
        packed_forward(enc.transformer, features["input_ids"], features["attention_mask"])

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="encoders.sentence"):
        SentenceEncoder(tiny_distilbert_dir, padding_free=True)
    assert [r.levelno for r in caplog.records if "padding-free" in r.getMessage()] == [logging.WARNING]


def test_compile_keeps_the_padded_path(tiny_model_dir, caplog):
    assert not SentenceEncoder(tiny_model_dir, compile=True).padding_free
    with caplog.at_level(logging.WARNING, logger="encoders.sentence"):
        enc = SentenceEncoder(tiny_model_dir, compile=True, padding_free=True)
    assert not enc.padding_free
    assert any("compile" in r.getMessage() for r in caplog.records)


def test_padding_free_is_recorded_and_state_dict_unchanged(tiny_model_dir):
    free, padded = SentenceEncoder(tiny_model_dir), SentenceEncoder(tiny_model_dir, padding_free=False)
    assert free.config_dict["padding_free"] is None and padded.config_dict["padding_free"] is False
    assert free.state_dict().keys() == padded.state_dict().keys()
    rebuilt = SentenceEncoder.from_checkpoint_config(padded.config_dict)
    assert not rebuilt.padding_free


def test_hooked_projections_are_called_as_modules(tiny_model_dir, one_torch_thread):
    """The fused query/key/value product applies to plain Linears; a hooked one (an adapter, say) is called as
    the padded model calls it, so the hook acts on both paths alike."""
    enc = SentenceEncoder(tiny_model_dir).eval()
    features = enc.tokenize(SENTENCES)
    with torch.no_grad():
        plain, _ = both(enc, features)
        handle = enc.transformer.encoder.layer[0].attention.self.value.register_forward_hook(
            lambda module, args, out: out * 0.5)
        hooked, padded = both(enc, features)
        handle.remove()
    assert not torch.allclose(hooked, plain)  # the hook acted on the padding-free path
    torch.testing.assert_close(hooked, padded, atol=1e-5, rtol=1e-5)
