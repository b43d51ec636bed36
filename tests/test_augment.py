"""The positive-view augmentations (encoders/augment.py) and DCLR's distillation: shapes, masks, and that one
gradient step trains through each."""
from __future__ import annotations

import pytest
import torch

from encoders.augment import AUGMENTATIONS, feature_cutoff, interior, positive_view, span_cutoff, token_cutoff, token_shuffle
from encoders.sentence import SentenceEncoder
from lightning_modules.dclr import DCLR
from lightning_modules.losses import distillation_kl
from lightning_modules.simcse import SimCSE

SENTENCES = ["a cat sleeps on the warm mat today", "dogs run", "it rains", "the band plays a long quiet song tonight"]


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, L) right-padded


def test_interior_leaves_out_cls_sep_and_padding():
    inner = interior(_mask([5, 2, 3], 6))
    assert inner.tolist() == [[False, True, True, True, False, False],
                              [False] * 6,
                              [False, True, False, False, False, False]]


def test_token_shuffle_permutes_the_interior_only():
    torch.manual_seed(0)
    mask = _mask([8, 3, 2, 6], 8)
    ids = torch.arange(100, 132).view(4, 8) * mask  # distinct ids, 0 on padding
    moved = torch.zeros(4, dtype=torch.bool)
    for _ in range(5):
        out = token_shuffle(ids, mask)
        assert out.shape == ids.shape
        inner = interior(mask)
        assert torch.equal(out[~inner], ids[~inner])  # [CLS], [SEP] and padding in place
        for row in range(4):  # the same multiset of interior ids
            assert sorted(out[row][inner[row]].tolist()) == sorted(ids[row][inner[row]].tolist())
        moved |= (out != ids).any(1)
    assert moved.tolist() == [True, False, False, True]  # rows with one or no interior token cannot move


@pytest.mark.parametrize("cut", [token_cutoff, span_cutoff])
def test_token_and_span_cutoff_zero_ceil_rate_of_the_interior(cut):
    torch.manual_seed(1)
    mask = _mask([12, 4, 2], 12)
    out = cut(mask, 0.25)
    assert out.shape == (3, 12, 1) and set(out.unique().tolist()) <= {0.0, 1.0}
    zeroed = out.squeeze(-1) == 0
    assert not zeroed[~interior(mask)].any()  # never [CLS], [SEP] or padding
    assert zeroed.sum(1).tolist() == [3, 1, 0]  # ceil(0.25 x 10), at least one of 2, none of 0
    if cut is span_cutoff:
        first = zeroed[0].nonzero().squeeze(-1)
        assert (first.diff() == 1).all()  # one contiguous span


def test_feature_cutoff_zeroes_the_same_dimensions_for_every_token_of_a_row():
    torch.manual_seed(2)
    out = feature_cutoff(3, 40, 0.1, torch.device("cpu"))
    assert out.shape == (3, 1, 40)
    assert (out == 0).sum(-1).squeeze(-1).tolist() == [4, 4, 4]
    assert not torch.equal(out[0], out[1])  # each row its own dimensions


def test_dropout_view_is_the_batch_itself_and_unknown_kind_is_an_error(tiny_model_dir):
    encoder = SentenceEncoder(tiny_model_dir)
    features = encoder.tokenize(SENTENCES)
    assert positive_view(features, "dropout", 0.1, encoder.dim) is features
    with pytest.raises(ValueError, match="augmentation must be one of"):
        SimCSE(encoder, augmentation="word_dropout")
    with pytest.raises(ValueError, match="augmentation_rate"):
        DCLR(encoder, use_weighting=False, augmentation="token_cutoff", augmentation_rate=1.5)


@pytest.mark.parametrize("padding_free", [False, True])
def test_embedding_mask_reaches_the_transformer_on_both_paths(tiny_model_dir, padding_free):
    """A zeroed token changes the sentence vector; the same cut gives the same vector on both paths."""
    encoder = SentenceEncoder(tiny_model_dir, pooling="mean", padding_free=padding_free).eval()
    features = encoder.tokenize(SENTENCES)
    keep = torch.ones(*features["input_ids"].shape, 1)
    keep[0, 2] = 0.0  # an interior token of the first sentence
    with torch.no_grad():
        plain = encoder(features)
        cut = encoder({**features, "embedding_mask": keep})
        again = encoder(features)
    assert not torch.allclose(plain[0], cut[0])
    torch.testing.assert_close(plain[1:], cut[1:])  # other rows untouched
    torch.testing.assert_close(plain, again)  # the hook is gone after the call
    other = SentenceEncoder(tiny_model_dir, pooling="mean", padding_free=not padding_free).eval()
    with torch.no_grad():
        torch.testing.assert_close(other({**features, "embedding_mask": keep}), cut, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", [k for k in AUGMENTATIONS if k != "dropout"])
@pytest.mark.parametrize("objective", ["simcse", "dclr"])
def test_one_gradient_step_under_each_augmentation(tiny_model_dir, kind, objective):
    torch.manual_seed(0)
    encoder = SentenceEncoder(tiny_model_dir, pooling="cls", mlp_head=True, mlp_only_train=True)
    if objective == "simcse":
        model = SimCSE(encoder, augmentation=kind, augmentation_rate=0.2)
    else:
        model = DCLR(encoder, complementary_model=tiny_model_dir, phi_quantile=0.9, augmentation=kind,
                     augmentation_rate=0.2)
    model.train()
    features = encoder.tokenize(SENTENCES)
    loss, logs = model.training_loss({"sentence": features})
    assert torch.isfinite(loss)
    optimizer = torch.optim.SGD(model.encoder.parameters(), lr=1.0)
    before = model.encoder.transformer.embeddings.word_embeddings.weight.detach().clone()
    loss.backward()
    optimizer.step()
    assert not torch.equal(before, model.encoder.transformer.embeddings.word_embeddings.weight)


def test_supervised_simcse_refuses_an_augmentation_naming_the_key(tiny_model_dir):
    """The NLI triples bring their own positives: an augmentation there is an error, not silently ignored."""
    encoder = SentenceEncoder(tiny_model_dir, pooling="cls")
    triple = {k: encoder.tokenize(SENTENCES[:2]) for k in ("anchor", "positive", "negative")}
    loss, _ = SimCSE(encoder).training_loss(triple)  # dropout: the supervised form as it always ran
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match="model.init_args.augmentation='token_cutoff'"):
        SimCSE(encoder, augmentation="token_cutoff").training_loss(triple)


def test_augmented_view_differs_from_the_dropout_view_with_dropout_off(tiny_model_dir):
    """With dropout off the two dropout views are identical; each augmentation alone moves the positive."""
    encoder = SentenceEncoder(tiny_model_dir, pooling="mean").eval()
    features = encoder.tokenize(SENTENCES)
    with torch.no_grad():
        plain = encoder(features)
        for kind in ("token_shuffle", "token_cutoff", "span_cutoff", "feature_cutoff"):
            torch.manual_seed(0)
            view = encoder(positive_view(features, kind, 0.3, encoder.dim))
            assert not torch.allclose(view[0], plain[0]), kind


def test_distillation_kl_is_zero_on_agreement_and_pulls_the_student_towards_the_teacher():
    teacher = torch.tensor([[0.9, 0.5, 0.1], [0.2, 0.8, 0.7]])
    assert distillation_kl(teacher, teacher.clone(), 0.05).abs() < 1e-6
    student = torch.zeros(2, 3, requires_grad=True)
    distillation_kl(teacher, student, 0.05).backward()
    assert (student.grad.argmin(-1) == teacher.argmax(-1)).all()  # gradient descent raises the teacher's top


def test_dclr_distillation_in_place_of_weighting(tiny_model_dir):
    torch.manual_seed(0)
    encoder = SentenceEncoder(tiny_model_dir, pooling="cls", mlp_head=True, mlp_only_train=True)
    model = DCLR(encoder, complementary_model=tiny_model_dir, use_weighting=False, distillation_weight=1.0)
    assert model.complementary is not None  # loaded for distillation although weighting is off
    features = encoder.tokenize(SENTENCES)
    loss, logs = model.training_loss({"sentence": features})
    assert torch.isfinite(loss) and logs["distillation_kl"] > 0
    assert "masked_fraction" not in logs  # nothing weighted
    without = DCLR(encoder, use_weighting=False)
    assert without.complementary is None
    with pytest.raises(ValueError, match="distillation_weight"):
        DCLR(encoder, complementary_model="self", distillation_weight=1.0)


def test_the_distillation_teacher_compares_two_dropout_views(tiny_model_dir):
    """Its positive is a pair of dropout views (cosine below 1, another draw each time), not a vector compared with
    itself: a (z, z) teacher has cosine 1 on every positive, and at tau 0.05 nearly all its mass there."""
    torch.manual_seed(0)
    encoder = SentenceEncoder(tiny_model_dir, pooling="cls", mlp_head=True, mlp_only_train=True)
    model = DCLR(encoder, complementary_model=tiny_model_dir, use_weighting=False, distillation_weight=1.0,
                 gather_across_devices=False)
    features = encoder.tokenize(SENTENCES)
    first, second = model.distillation_teacher(features), model.distillation_teacher(features)
    positives = first.diagonal()  # (B,) each sentence's two views
    assert (positives < 1 - 1e-4).all()  # a (z, z) teacher: exactly 1
    assert not torch.equal(first, second)  # new dropout masks on every call
    assert not model.complementary.training  # back in eval mode after its passes
    _, logs = model.training_loss({"sentence": features})
    for name in ("teacher", "student"):
        assert 0 < logs[f"distill_{name}_positive_mass"] < 1 and logs[f"distill_{name}_entropy"] > 0
