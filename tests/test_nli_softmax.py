"""NLISoftmax's classifier input (the SBERT paper's Table 6 ablation): width and content of each combination."""
from __future__ import annotations

import itertools

import pytest
import torch

from encoders.sentence import SentenceEncoder
from lightning_modules import NLISoftmax
from lightning_modules.losses import PAIR_FEATURES, sbert_pair_features

U = torch.tensor([[1.0, -2.0], [0.5, 3.0]])  # (B=2, H=2)
V = torch.tensor([[4.0, 1.0], [0.5, -1.0]])
BY_HAND = {"u": [[1.0, -2.0], [0.5, 3.0]], "v": [[4.0, 1.0], [0.5, -1.0]],
           "abs_diff": [[3.0, 3.0], [0.0, 4.0]], "prod": [[4.0, -2.0], [0.25, -3.0]]}
COMBINATIONS = [list(c) for r in range(1, 5) for c in itertools.permutations(PAIR_FEATURES, r)]


@pytest.mark.parametrize("features", COMBINATIONS, ids="-".join)
def test_each_combination_computes_what_it_says(features):
    expected = torch.cat([torch.tensor(BY_HAND[f]) for f in features], dim=-1)  # (2, 2 * len)
    assert torch.equal(sbert_pair_features(U, V, features), expected)


def test_default_is_sberts_u_v_abs_diff():
    assert torch.equal(sbert_pair_features(U, V), torch.cat([U, V, (U - V).abs()], dim=-1))


@pytest.fixture(scope="module")
def tiny_encoder(tiny_model_dir):
    return SentenceEncoder(tiny_model_dir, pretrained=False)


@pytest.mark.parametrize("features", [["u", "v", "abs_diff"], ["abs_diff"], ["u", "v", "prod"],
                                      ["u", "v", "abs_diff", "prod"]], ids="-".join)
def test_classifier_width_follows_the_option(tiny_encoder, features):
    model = NLISoftmax(tiny_encoder, features=features)
    assert model.classifier.in_features == len(features) * tiny_encoder.dim
    assert model.hparams.features == features  # travels in the checkpoint's hyperparameters


def test_default_is_the_papers(tiny_encoder):
    model = NLISoftmax(tiny_encoder)
    assert model.features == ["u", "v", "abs_diff"] and model.classifier.in_features == 3 * tiny_encoder.dim


def test_training_loss_uses_the_chosen_input(tiny_encoder):
    model = NLISoftmax(tiny_encoder, features=["prod", "u"])
    feats = tiny_encoder.tokenize(["a cat sits", "dogs run fast"])
    batch = {"sentence1": feats, "sentence2": feats, "label": torch.tensor([0, 2])}
    loss, _ = model.training_loss(batch)
    model.eval()
    with torch.no_grad():
        u = tiny_encoder(feats)
        logits = model.classifier(torch.cat([u * u, u], dim=-1))
        assert torch.allclose(model.training_loss(batch)[0], torch.nn.functional.cross_entropy(logits, batch["label"]))
    assert loss.isfinite()


@pytest.mark.parametrize("features", [[], ["u", "u"], ["sum"]])
def test_bad_features_are_refused(tiny_encoder, features):
    with pytest.raises(ValueError, match="features must be distinct names"):
        NLISoftmax(tiny_encoder, features=features)
