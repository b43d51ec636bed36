"""Each loss against a hand derivation or a naive loop implementation."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_modules.losses import (
    alignment,
    cosine_similarity_matrix,
    dclr_loss,
    dclr_noise_ascent,
    dclr_official_loss,
    dclr_weights,
    in_batch_accuracy,
    info_nce_loss,
    quantile_threshold,
    triplet_loss,
    uniformity,
)

torch.set_num_threads(1)
D = torch.float64


def _cos(u, v):
    return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


def _dist(u, v):
    return math.sqrt(sum((a - b) ** 2 for a, b in zip(u, v)))


# --------------------------------------------------------------------------- triplet


def test_triplet_by_hand():
    a = torch.tensor([[0.0, 0.0], [0.0, 0.0]], dtype=D)
    p = torch.tensor([[3.0, 4.0], [1.0, 0.0]], dtype=D)  # d(a, p) = 5, 1
    n = torch.tensor([[0.0, 2.0], [0.0, 3.0]], dtype=D)  # d(a, n) = 2, 3
    # row 0: max(5 - 2 + 1, 0) = 4; row 1: max(1 - 3 + 1, 0) = 0; mean = 2
    assert triplet_loss(a, p, n).item() == pytest.approx(2.0)
    # margin 3: row 0 -> 6, row 1 -> 1; mean 3.5
    assert triplet_loss(a, p, n, margin=3.0).item() == pytest.approx(3.5)


def test_triplet_against_loop():
    g = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(5, 3, generator=g, dtype=D) for _ in range(3))
    expected = sum(
        max(_dist(a[i].tolist(), p[i].tolist()) - _dist(a[i].tolist(), n[i].tolist()) + 1.0, 0.0) for i in range(5)
    ) / 5
    assert triplet_loss(a, p, n).item() == pytest.approx(expected, abs=1e-12)


# --------------------------------------------------------------------------- InfoNCE


def test_cosine_matrix_against_loop_and_fp32():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(3, 4, generator=g, dtype=D), torch.randn(5, 4, generator=g, dtype=D)
    sims = cosine_similarity_matrix(a, b)
    assert sims.shape == (3, 5)
    for i in range(3):
        for j in range(5):
            assert sims[i, j].item() == pytest.approx(_cos(a[i].tolist(), b[j].tolist()), abs=1e-12)
    assert cosine_similarity_matrix(a.bfloat16(), b.bfloat16()).dtype == torch.float32


def test_mnr_hard_negatives_by_hand():
    # Anchors a1 = (1, 0), a2 = (0, 1); positives p1 = (1, 0), p2 = (1, 1);
    # hard negatives n1 = (0, 1), n2 = (-1, 0). Keys = [p1, p2, n1, n2], labels = [0, 1].
    # cos(a1, .) = [1, 1/sqrt2, 0, -1]; cos(a2, .) = [0, 1/sqrt2, 1, 0].
    # loss_1 = -log(e^{20} / (e^{20} + e^{20/sqrt2} + e^0 + e^{-20}))
    # loss_2 = -log(e^{20/sqrt2} / (e^0 + e^{20/sqrt2} + e^{20} + e^0))
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=D)
    pos = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=D)
    neg = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=D)
    r = 20 / math.sqrt(2)
    loss1 = -math.log(math.exp(20) / (math.exp(20) + math.exp(r) + 1 + math.exp(-20)))
    loss2 = -math.log(math.exp(r) / (1 + math.exp(r) + math.exp(20) + 1))
    loss, logits = info_nce_loss(q, torch.cat([pos, neg]), torch.tensor([0, 1]), scale=20.0)
    assert logits.shape == (2, 4)
    assert loss.item() == pytest.approx((loss1 + loss2) / 2, abs=1e-10)
    # anchor 1 ranks its positive first, anchor 2 ranks n1 first
    assert in_batch_accuracy(logits, torch.tensor([0, 1])).item() == pytest.approx(0.5)


def test_info_nce_against_loop_with_offset_labels():
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(3, 4, generator=g, dtype=D), torch.randn(7, 4, generator=g, dtype=D)
    labels = torch.tensor([3, 4, 5])  # as on rank 1 with B = 3
    scale = 1 / 0.05
    expected = 0.0
    for i in range(3):
        logits = [scale * _cos(q[i].tolist(), k[j].tolist()) for j in range(7)]
        expected += -logits[labels[i]] + math.log(sum(math.exp(x) for x in logits))
    loss, _ = info_nce_loss(q, k, labels, scale)
    assert loss.item() == pytest.approx(expected / 3, abs=1e-9)


# --------------------------------------------------------------------------- Wang & Isola


def test_alignment_uniformity_against_loop():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(5, 3, generator=g, dtype=D), torch.randn(5, 3, generator=g, dtype=D)
    xn, yn = F.normalize(x, dim=-1).tolist(), F.normalize(y, dim=-1).tolist()
    align3 = sum(_dist(xn[i], yn[i]) ** 3 for i in range(5)) / 5
    assert alignment(x, y, alpha=3).item() == pytest.approx(align3, abs=1e-12)
    assert alignment(x, y).item() == pytest.approx(sum(_dist(xn[i], yn[i]) ** 2 for i in range(5)) / 5, abs=1e-12)
    pairs = [math.exp(-2 * _dist(xn[i], xn[j]) ** 2) for i in range(5) for j in range(i + 1, 5)]
    assert uniformity(x).item() == pytest.approx(math.log(sum(pairs) / len(pairs)), abs=1e-12)


# --------------------------------------------------------------------------- DCLR weights


def test_dclr_weights_paper_zeroes_at_or_above_phi():
    sims = torch.tensor([[0.1, 0.5, 0.7], [0.49, 0.5, -0.3]])
    expected = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    assert torch.equal(dclr_weights(sims, phi=0.5), expected)


def test_dclr_weights_official_threshold_follows_temperature():
    sims = torch.tensor([[0.1, 0.5, 0.7, 0.95], [0.49, 0.5, -0.3, 0.51]])
    paper = dclr_weights(sims, phi=0.5, rule="paper")
    official = dclr_weights(sims, phi=0.5, rule="official", temperature=0.1)
    at_phi = sims == 0.5
    assert torch.equal(official[~at_phi], paper[~at_phi])
    assert torch.all(official[at_phi] == 1) and torch.all(paper[at_phi] == 0)
    # A hard-coded phi * 20 at temperature 0.1 would keep 0.7 and 0.95 (cos / 0.1 < 10).
    assert official[0, 2] == 0 and official[0, 3] == 0
    # a cosine equal to a phi that is not exactly representable is still "equal"
    sims = torch.tensor([[0.3, 0.31, 0.29]])
    assert torch.equal(dclr_weights(sims, phi=0.3, rule="official", temperature=0.07), torch.tensor([[1.0, 0.0, 1.0]]))


@pytest.mark.parametrize("phi", [0.0, -0.1, 1.5])
def test_dclr_weights_rejects_bad_phi(phi):
    with pytest.raises(ValueError, match="phi"):
        dclr_weights(torch.zeros(1, 1), phi=phi)


# --------------------------------------------------------------------------- DCLR loss


def _dclr_loop(pos, neg, w, tau, masked):
    total = 0.0
    for i in range(len(pos)):
        num = math.exp(pos[i] / tau)
        den = num
        for j in range(len(neg[i])):
            if masked == "remove":
                den += w[i][j] * math.exp(neg[i][j] / tau)
            else:  # the official code multiplies the logit by the weight
                den += math.exp(w[i][j] * neg[i][j] / tau)
        total += -math.log(num / den)
    return total / len(pos)


@pytest.mark.parametrize("masked", ["remove", "zero_logit"])
def test_dclr_loss_against_loop(masked):
    g = torch.Generator().manual_seed(4)
    pos = torch.rand(4, generator=g, dtype=D) * 2 - 1
    neg = torch.rand(4, 5, generator=g, dtype=D) * 2 - 1
    w = (torch.rand(4, 5, generator=g, dtype=D) > 0.4).to(D)
    w[0] = 0  # an anchor with every negative masked: only its positive is left
    expected = _dclr_loop(pos.tolist(), neg.tolist(), w.tolist(), 0.05, masked)
    assert dclr_loss(pos, neg, w, masked=masked).item() == pytest.approx(expected, abs=1e-9)


def test_dclr_loss_modes_differ_and_remove_is_finite():
    pos = torch.tensor([0.9], dtype=D, requires_grad=True)
    neg = torch.tensor([[0.95, 0.2]], dtype=D, requires_grad=True)
    w = torch.tensor([[0.0, 1.0]], dtype=D)
    removed = dclr_loss(pos, neg, w, masked="remove")
    zeroed = dclr_loss(pos, neg, w, masked="zero_logit")
    # zero_logit keeps exp(0) = 1 for the masked negative in the denominator
    assert zeroed.item() > removed.item()
    removed.backward()
    assert torch.isfinite(neg.grad).all() and neg.grad[0, 0] == 0


def test_dclr_loss_rejects_bad_temperature():
    with pytest.raises(ValueError, match="temperature"):
        dclr_loss(torch.zeros(1), torch.zeros(1, 1), torch.ones(1, 1), temperature=0.0)


# --------------------------------------------------------------------------- DCLR noise


def _paper_lu_loop(a, p, noise, tau):
    # noise[i] lists anchor i's noise vectors
    total = 0.0
    for i in range(len(a)):
        num = math.exp(_cos(a[i], p[i]) / tau)
        den = sum(math.exp(_cos(a[i], n) / tau) for n in noise[i])
        total += -math.log(num / den)
    return total / len(a)


@pytest.mark.parametrize("shared", [False, True])
def test_noise_ascent_increases_lu_and_keeps_encoder_out(shared):
    g = torch.Generator().manual_seed(5)
    B, k, H = 4, 3, 6
    encoder = torch.nn.Linear(H, H).double()
    calls = []
    encoder.register_full_backward_hook(lambda *args: calls.append(1))
    anchors = encoder(torch.randn(B, H, generator=g, dtype=D))  # with graph into the encoder
    anchors.retain_grad()
    positives = torch.randn(B, H, generator=g, dtype=D, requires_grad=True)
    noise = torch.randn((k, H) if shared else (B, k, H), generator=g, dtype=D) * 0.3
    moved, diag = dclr_noise_ascent(anchors, positives, noise, steps=4, beta=1e-2)
    assert moved.shape == noise.shape and moved.grad_fn is None and not moved.requires_grad
    assert anchors.grad is None and positives.grad is None
    assert calls == [] and encoder.weight.grad is None
    per_anchor = lambda n: [n.tolist()] * B if shared else n.tolist()  # noqa: E731
    a, p = anchors.tolist(), positives.tolist()
    assert diag["lu_before"].item() == pytest.approx(_paper_lu_loop(a, p, per_anchor(noise), 0.05), abs=1e-9)
    assert diag["lu_after"].item() == pytest.approx(_paper_lu_loop(a, p, per_anchor(moved), 0.05), abs=1e-9)
    assert diag["lu_after"] > diag["lu_before"]
    assert diag["cos_after"] > diag["cos_before"] and diag["cos_shift"] > 0
    # every noise vector moves by beta per step along a unit direction: at most 4 * beta
    step = torch.linalg.vector_norm(moved - noise, dim=-1)
    assert torch.all(step <= 4e-2 + 1e-12) and torch.all(step > 0)
    assert diag["noise_step_norm"].item() == pytest.approx(step.mean().item())
    assert all(v.grad_fn is None for v in diag.values())


def test_noise_ascent_single_step_is_normalised_gradient():
    g = torch.Generator().manual_seed(6)
    anchors, positives = torch.randn(3, 5, generator=g, dtype=D), torch.randn(3, 5, generator=g, dtype=D)
    noise = torch.randn(3, 2, 5, generator=g, dtype=D)
    leaf = noise.clone().requires_grad_(True)
    a = F.normalize(anchors, dim=-1)
    lu = (torch.logsumexp(torch.einsum("bh,bkh->bk", a, F.normalize(leaf, dim=-1)) / 0.05, -1)).mean()
    (grad,) = torch.autograd.grad(lu, leaf)
    expected = noise + 1e-3 * grad / grad.norm(dim=-1, keepdim=True)
    moved, _ = dclr_noise_ascent(anchors, positives, noise, steps=1)
    assert torch.allclose(moved, expected, atol=1e-12)


def test_noise_ascent_relative_step_moves_by_beta_times_the_norm():
    g = torch.Generator().manual_seed(7)
    anchors, positives = torch.randn(3, 5, generator=g, dtype=D), torch.randn(3, 5, generator=g, dtype=D)
    noise = 10 * torch.randn(3, 2, 5, generator=g, dtype=D)
    moved, diag = dclr_noise_ascent(anchors, positives, noise, tau_u=1.0, steps=1, beta=0.1, relative_step=True)
    step = torch.linalg.vector_norm(moved - noise, dim=-1)
    torch.testing.assert_close(step, 0.1 * torch.linalg.vector_norm(noise, dim=-1))
    assert diag["cos_shift"].item() > 0  # ascent turns the noise towards the anchors


def test_dclr_official_loss_by_hand():
    # One anchor, one in-batch negative (weight 1), one masked negative (weight 0: logit 0), tau 0.5.
    pos, neg, w = torch.tensor([0.8], dtype=D), torch.tensor([[0.3, 0.6]], dtype=D), torch.tensor([[1.0, 0.0]], dtype=D)
    logits = [0.8 / 0.5, 0.3 / 0.5, 0.0]
    z = sum(math.exp(x) for x in logits)
    p = [math.exp(x) / z for x in logits]
    expected = -(math.log(p[0]) + math.log(1 - p[1]) + math.log(1 - p[2])) / 3
    assert dclr_official_loss(pos, neg, w, temperature=0.5).item() == pytest.approx(expected, rel=1e-6)


def test_dclr_official_loss_against_bce_of_softmax():
    g = torch.Generator().manual_seed(8)
    pos, neg = torch.rand(4, generator=g, dtype=D), torch.rand(4, 6, generator=g, dtype=D) * 2 - 1
    w = (torch.rand(4, 6, generator=g) > 0.3).to(D)
    p = torch.softmax(torch.cat([pos[:, None], neg * w], -1) / 0.05, -1)
    y = torch.zeros_like(p)
    y[:, 0] = 1
    expected = F.binary_cross_entropy(p, y)  # the official code's nn.BCELoss on the softmax
    torch.testing.assert_close(dclr_official_loss(pos, neg, w, 0.05), expected)
    # and it differs from the paper's row cross-entropy on the same logits
    assert abs(dclr_official_loss(pos, neg, w, 0.05).item() - dclr_loss(pos, neg, w, 0.05, "zero_logit").item()) > 0.1


def test_quantile_threshold_masks_the_top_of_the_batch():
    sims = torch.arange(100, dtype=torch.float32).view(10, 10) / 100  # 0.00 .. 0.99
    t = quantile_threshold(sims, 0.9)
    assert (sims >= t).sum().item() == 10
    with pytest.raises(ValueError):
        quantile_threshold(sims, 1.0)


def test_noise_ascent_infonce_matches_official_in_batch_step():
    # The official code ascends CE over [sim(a_i, all positives), sim(a_i, noise)] / tau, label i.
    g = torch.Generator().manual_seed(7)
    B, H = 4, 6
    anchors, positives = torch.randn(B, H, generator=g, dtype=D), torch.randn(B, H, generator=g, dtype=D)
    noise = torch.randn(5, H, generator=g, dtype=D) * 0.3
    leaf = noise.clone().requires_grad_(True)
    logits = torch.cat([cosine_similarity_matrix(anchors, positives), cosine_similarity_matrix(anchors, leaf)], 1)
    (grad,) = torch.autograd.grad(F.cross_entropy(logits / 0.05, torch.arange(B)), leaf)
    expected = noise + 1e-3 * grad / grad.norm(dim=-1, keepdim=True)
    others = positives.expand(B, B, H)[~torch.eye(B, dtype=torch.bool)].view(B, B - 1, H)  # (B, B-1, H)
    moved, diag = dclr_noise_ascent(
        anchors, positives, noise, steps=1, objective="infonce", in_batch_negatives=others
    )
    assert torch.allclose(moved, expected, atol=1e-12)
    assert diag["objective_after"] > diag["objective_before"]


def test_noise_ascent_under_autocast_and_no_grad():
    g = torch.Generator().manual_seed(8)
    B, H = 4, 6
    anchors = torch.randn(B, H, generator=g, requires_grad=True)
    positives = torch.randn(B, H, generator=g)
    noise = torch.randn(5, H, generator=g) * 0.3
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        moved, diag = dclr_noise_ascent(
            anchors.bfloat16(), positives, noise, steps=3, beta=1e-2, objective="infonce", in_batch_negatives=positives
        )
    assert moved.dtype == torch.float32 and moved.grad_fn is None and anchors.grad is None
    assert diag["objective_after"] > diag["objective_before"]
