"""Matryoshka dimensions (``model.init_args.matryoshka_dims``): the loss is the weighted sum of the losses of the
truncated embeddings, computed in one place (the base class) for every objective whose loss is over embeddings,
through GradCache too; the dev score can be taken at a dimension; and it is a real gain at a small dimension."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import train
from encoders.sentence import SentenceEncoder
from harness.cli import SentenceCLI
from lightning_modules import MNR, DCLR, NLISoftmax, SimCSE, STSRegression, Triplet
from lightning_modules.losses import matryoshka_loss
from tests.test_train import SIMCSE_ENCODER, objective_config

DIMS, WEIGHTS = [32, 16, 8], [1.0, 0.5, 2.0]
SENTENCES = ["A man plays a guitar.", "Someone plays an instrument.", "A man plays a piano.", "Dogs run in a park.",
             "Two dogs are running.", "A cat sleeps on a sofa.", "It is raining in the city.", "The street is wet.",
             "A bird sits on the wire.", "Children play football.", "Kids kick a ball.", "A boy reads quietly."]


def test_matryoshka_loss_is_the_weighted_sum_over_slices():
    a, b = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)
    calls = []

    def loss_fn(embs):
        calls.append(embs[0].shape[1])
        return (embs[0] * embs[1]).sum()

    total, parts = matryoshka_loss(loss_fn, [a, b], [6, 2], [1.0, 3.0])
    by_hand = (a * b).sum() + 3.0 * (a[:, :2] * b[:, :2]).sum()
    assert calls == [6, 2] and torch.allclose(total, by_hand)
    assert torch.allclose(parts[2], (a[:, :2] * b[:, :2]).sum())


def _encoder(tiny: str, **kwargs) -> SentenceEncoder:
    return SentenceEncoder(tiny, max_seq_length=32, **kwargs).eval()  # eval: no dropout, so two passes agree


def _features(encoder, start: int, n: int = 4):
    return encoder.tokenize(SENTENCES[start:start + n])


def _mnr_by_hand(a, p, negatives, scale):
    """MNR written out: the cosine of each truncation (renormalised), a softmax over all candidates."""
    keys = F.normalize(torch.cat([p, *negatives]), dim=-1)
    logits = scale * F.normalize(a, dim=-1) @ keys.T  # (B, (1 + n) B)
    return F.cross_entropy(logits, torch.arange(a.shape[0]))


@pytest.mark.parametrize("mini_batch_size", [None, 2], ids=["whole-batch", "gradcache"])
def test_mnr_loss_equals_the_weighted_sum_by_hand(tiny_model_dir, mini_batch_size):
    encoder = _encoder(tiny_model_dir)
    model = MNR(encoder, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS, mini_batch_size=mini_batch_size)
    model.eval()  # training_loss runs as in training, without dropout, so the hand computation sees the same
    batch = {"anchor": _features(encoder, 0), "positive": _features(encoder, 4),
             "negative_1": _features(encoder, 8), "negative_2": _features(encoder, 2)}
    loss, _ = model.training_loss(batch)
    with torch.no_grad():
        a, p, n1, n2 = (encoder(batch[k]) for k in ("anchor", "positive", "negative_1", "negative_2"))
        by_hand = sum(w * _mnr_by_hand(a[:, :d], p[:, :d], [n1[:, :d], n2[:, :d]], 20.0) for d, w in zip(DIMS, WEIGHTS))
    torch.testing.assert_close(loss.detach(), by_hand, rtol=1e-5, atol=1e-6)
    assert set(model._loss_parts) == set(DIMS)
    torch.testing.assert_close(model._loss_parts[8], _mnr_by_hand(a[:, :8], p[:, :8], [n1[:, :8], n2[:, :8]], 20.0),
                               rtol=1e-5, atol=1e-6)


def test_gradcache_gives_the_matryoshka_gradients_of_the_whole_batch(tiny_model_dir):
    grads = []
    for mini_batch_size in (None, 2):
        encoder = _encoder(tiny_model_dir)
        model = MNR(encoder, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS, mini_batch_size=mini_batch_size).eval()
        batch = {"anchor": _features(encoder, 0), "positive": _features(encoder, 4), "negative": _features(encoder, 8)}
        model.training_loss(batch)[0].backward()
        grads.append(encoder.transformer.embeddings.word_embeddings.weight.grad.clone())
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_triplet_truncates_without_renormalising_and_sts_regression_renormalises(tiny_model_dir):
    encoder = _encoder(tiny_model_dir)
    a, p, n = _features(encoder, 0), _features(encoder, 4), _features(encoder, 8)
    triplet = Triplet(encoder, margin=1.0, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS).eval()
    loss, _ = triplet.training_loss({"anchor": a, "positive": p, "negative": n})
    with torch.no_grad():
        ea, ep, en = encoder(a), encoder(p), encoder(n)
        by_hand = sum(w * F.relu((ea[:, :d] - ep[:, :d]).norm(dim=-1) - (ea[:, :d] - en[:, :d]).norm(dim=-1) + 1.0).mean()
                      for d, w in zip(DIMS, WEIGHTS))
    torch.testing.assert_close(loss.detach(), by_hand, rtol=1e-5, atol=1e-6)

    score = torch.tensor([0.1, 0.9, 0.5, 0.3])
    sts = STSRegression(encoder, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS).eval()
    loss, _ = sts.training_loss({"sentence1": a, "sentence2": p, "score": score})
    by_hand = sum(w * ((F.normalize(ea[:, :d], dim=-1) * F.normalize(ep[:, :d], dim=-1)).sum(-1) - score).pow(2).mean()
                  for d, w in zip(DIMS, WEIGHTS))
    torch.testing.assert_close(loss.detach(), by_hand, rtol=1e-5, atol=1e-6)


def test_supervised_simcse_and_dclr_sum_over_dimensions(tiny_model_dir):
    encoder = _encoder(tiny_model_dir)
    batch = {"anchor": _features(encoder, 0), "positive": _features(encoder, 4), "negative": _features(encoder, 8)}
    simcse = SimCSE(encoder, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS).eval()
    loss, _ = simcse.training_loss(batch)
    with torch.no_grad():
        a, p, n = (encoder(batch[k]) for k in ("anchor", "positive", "negative"))
        by_hand = sum(w * _mnr_by_hand(a[:, :d], p[:, :d], [n[:, :d]], 20.0) for d, w in zip(DIMS, WEIGHTS))
    torch.testing.assert_close(loss.detach(), by_hand, rtol=1e-5, atol=1e-6)
    # DCLR without noise or weighting is InfoNCE over two views (here the same, in eval mode)
    dclr = DCLR(encoder, use_noise=False, use_weighting=False, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS).eval()
    sentence = _features(encoder, 0, 6)
    loss, _ = dclr.training_loss({"sentence": sentence})
    with torch.no_grad():
        z = encoder(sentence)
        by_hand = sum(w * _mnr_by_hand(z[:, :d], z[:, :d], [], 20.0) for d, w in zip(DIMS, WEIGHTS))
    torch.testing.assert_close(loss.detach(), by_hand, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make, message", [
    (lambda e: NLISoftmax(e, matryoshka_dims=[16]), "NLISoftmax's loss is not a function of the embeddings alone"),
    (lambda e: MNR(e, matryoshka_dims=[64, 16]), "64 is not a dimension of the encoder's 32-dimensional"),
    (lambda e: MNR(e, matryoshka_dims=[16, 16]), "repeats a dimension"),
    (lambda e: MNR(e, matryoshka_dims=[32, 16], matryoshka_weights=[1.0]), "1 weights for 2 matryoshka_dims"),
    (lambda e: MNR(e, matryoshka_dims=[32, 16], matryoshka_weights=[1.0, 0.0]), "every weight must be > 0"),
    (lambda e: MNR(e, val_truncate_dim=33), "val_truncate_dim: 33 is not a dimension"),
])
def test_bad_settings_name_the_key(tiny_model_dir, make, message):
    with pytest.raises(ValueError, match=message):
        make(_encoder(tiny_model_dir))


def test_short_fits_log_each_dimension_and_score_dev_at_a_dimension(tmp_path, tiny_model_dir, fixtures_dir):
    for model, data, extra in [
        ("MNR", "NLIDataModule", {"data_args": {"view": "triplets"}, "model_args": {"mini_batch_size": 3}}),
        ("DCLR", "WikiDataModule", {"encoder_args": SIMCSE_ENCODER,
                                    "model_args": {"complementary_model": tiny_model_dir}}),
    ]:
        extra["model_args"] = {**extra["model_args"], "matryoshka_dims": [32, 8], "val_truncate_dim": 8}
        config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, model, data, **extra)
        cli = train.main(["--config", config])
        metrics = cli.trainer.callback_metrics
        assert {"train/loss_dim32", "train/loss_dim8"} <= set(metrics), model
        assert torch.isfinite(metrics["train/loss"])
    # the dev score at dimension 8 is the Spearman of the cosines of the first 8 dimensions
    from scipy.stats import spearmanr

    from datamodules.scored import load_sts_pairs

    encoder = cli.model.encoder
    cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    pairs = load_sts_pairs(str(fixtures_dir / "sts" / "stsb.dev.tsv"))
    u, v = encoder.encode(pairs["sentence1"])[:, :8], encoder.encode(pairs["sentence2"])[:, :8]
    expected = 100 * spearmanr(F.cosine_similarity(u, v).numpy(), pairs["score"]).correlation
    assert float(cli.trainer.callback_metrics["val/stsb_spearman"]) == pytest.approx(expected, abs=1e-3)


def _fit_and_score(tmp_path, tiny, fixtures, matryoshka: bool) -> dict[int, float]:
    """MNR on the NLI fixture's triplets, then the seven STS tasks' average (the fixture's samples of them) on the
    first 8 and 4 of the 32 dimensions; both arms share the seed, data, steps and learning rate."""
    from harness.sts_eval import evaluate_sts

    args = {"matryoshka_dims": [32, 16, 8]} if matryoshka else {}
    config = objective_config(tmp_path, tiny, fixtures, "MNR", "NLIDataModule", data_args={"view": "triplets"},
                              model_args=args)
    cli = SentenceCLI(args=["--config", config, "--trainer.max_steps", "40", "--trainer.val_check_interval", "40",
                            "--trainer.max_epochs", "-1"])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    encoder = cli.model.encoder
    return {d: evaluate_sts(lambda s: encoder.encode(s)[:, :d], str(fixtures / "sts"))["avg"] for d in (8, 4)}


def test_matryoshka_mnr_beats_plain_mnr_at_a_quarter_of_the_dimensions(tmp_path, tiny_model_dir, fixtures_dir):
    # The tiny model is 32 wide: 8 dimensions are a quarter of it (64 of 256), 4 an eighth (48 of 384).
    (tmp_path / "m").mkdir()
    (tmp_path / "plain").mkdir()
    plain = _fit_and_score(tmp_path / "plain", tiny_model_dir, fixtures_dir, matryoshka=False)
    nested = _fit_and_score(tmp_path / "m", tiny_model_dir, fixtures_dir, matryoshka=True)
    assert nested[8] > plain[8] and nested[4] > plain[4], (nested, plain)
