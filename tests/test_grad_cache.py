"""GradCache must give the gradients of the full-batch computation, dropout included.

The reference embeds the same mini-batches in the same order with graph kept: on CPU one
16-row dropout call does not draw the same mask as four 4-row calls (one seed per call), so
"same seed" means "same calls in the same order", which is what GradCache's first pass does.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from lightning_modules import grad_cache as gc
from lightning_modules.losses import cosine_similarity_matrix, info_nce_loss

N, CHUNK, H_IN, H = 16, 4, 6, 5


def _encoder(dtype=torch.float64) -> torch.nn.Module:
    torch.manual_seed(0)
    enc = torch.nn.Sequential(torch.nn.Linear(H_IN, 8), torch.nn.Dropout(0.1), torch.nn.Tanh(), torch.nn.Linear(8, H))
    return enc.to(dtype).train()


def _chunks(x: torch.Tensor) -> list[torch.Tensor]:
    return list(x.split(CHUNK))


def _simcse_loss(embs: list[torch.Tensor]) -> torch.Tensor:
    anchors, positives = embs  # (N, H) each
    return info_nce_loss(anchors, positives, torch.arange(anchors.shape[0]), scale=20.0)[0]


def _mnr_loss(embs: list[torch.Tensor]) -> torch.Tensor:
    anchors, positives, negatives = embs  # (N, H) each
    keys = torch.cat([positives, negatives])  # (2N, H)
    return info_nce_loss(anchors, keys, torch.arange(anchors.shape[0]), scale=20.0)[0]


def _reference(enc, columns, loss_fn, seed=1):
    torch.manual_seed(seed)
    loss = loss_fn([torch.cat([enc(chunk) for chunk in column]) for column in columns])
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in enc.parameters()]


def _cached(enc, columns, loss_fn, seed=1, grad_multiplier=1.0):
    enc.zero_grad()
    torch.manual_seed(seed)
    loss = gc.grad_cache_loss(enc, columns, loss_fn)
    (loss * grad_multiplier).backward()  # as a GradScaler would
    return loss.detach(), [p.grad.clone() for p in enc.parameters()]


def _data(dtype=torch.float64):
    g = torch.Generator().manual_seed(2)
    return [torch.randn(N, H_IN, generator=g, dtype=dtype) for _ in range(3)]


def test_simcse_dropout_views_match_full_batch():
    # SimCSE: both columns are the same sentences; the positive is the second dropout draw.
    enc = _encoder()
    x = _data()[0]
    columns = [_chunks(x), _chunks(x)]
    ref_loss, ref_grads = _reference(enc, columns, _simcse_loss)
    loss, grads = _cached(enc, columns, _simcse_loss)
    assert ref_loss.item() > 0.1  # dropout makes the two views differ
    assert torch.allclose(loss, ref_loss, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-5)


def test_mnr_with_hard_negatives_and_scaled_backward():
    enc = _encoder()
    columns = [_chunks(x) for x in _data()]
    _, ref_grads = _reference(enc, columns, _mnr_loss)
    _, grads = _cached(enc, columns, _mnr_loss, grad_multiplier=3.0)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, 3.0 * r, atol=1e-5)


def test_without_rng_replay_gradients_differ(monkeypatch):
    enc = _encoder()
    x = _data()[0]
    columns = [_chunks(x), _chunks(x)]
    _, ref_grads = _reference(enc, columns, _simcse_loss)
    monkeypatch.setattr(gc._RngState, "restored", lambda self: contextlib.nullcontext())
    _, grads = _cached(enc, columns, _simcse_loss)
    assert not all(torch.allclose(g, r, atol=1e-5) for g, r in zip(grads, ref_grads))


def test_trainable_part_of_loss_gets_its_gradient():
    enc = _encoder()
    log_scale = torch.nn.Parameter(torch.tensor(3.0, dtype=torch.float64))

    def loss_fn(embs):
        logits = log_scale.exp() * cosine_similarity_matrix(*embs)  # (N, N)
        return torch.nn.functional.cross_entropy(logits, torch.arange(N))

    columns = [_chunks(x) for x in _data()[:2]]
    _, ref_grads = _reference(enc, columns, loss_fn)
    ref_scale_grad = log_scale.grad.clone()
    log_scale.grad = None
    _, grads = _cached(enc, columns, loss_fn)
    assert torch.allclose(log_scale.grad, ref_scale_grad, atol=1e-10)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-5)


def test_autocast_is_replayed_on_backward():
    # Lightning runs backward outside autocast; the replay must still embed in bf16.
    enc = _encoder(torch.float32)
    columns = [_chunks(x) for x in _data(torch.float32)[:2]]
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _simcse_loss([torch.cat([enc(c) for c in col]) for col in columns])
    ref.backward()
    ref_grads = [p.grad.clone() for p in enc.parameters()]
    enc.zero_grad()
    dtypes = []

    def embed(chunk):
        out = enc(chunk)
        dtypes.append(out.dtype)
        return out

    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = gc.grad_cache_loss(embed, columns, _simcse_loss)
    loss.backward()
    assert dtypes == [torch.bfloat16] * (2 * 2 * N // CHUNK)  # first pass and replay
    assert loss.dtype == torch.float32 and torch.allclose(loss, ref.detach())
    # Not bit-equal: the reference sums the chunks' weight gradients in bf16, GradCache in fp32.
    for p, r in zip(enc.parameters(), ref_grads):
        assert torch.allclose(p.grad, r, rtol=2e-2, atol=1e-2)


def test_no_grad_just_computes_the_loss():
    enc = _encoder()
    columns = [_chunks(x) for x in _data()[:2]]
    enc.eval()
    with torch.no_grad():
        loss = gc.grad_cache_loss(enc, columns, _simcse_loss)
    expected = _simcse_loss([enc(torch.cat(col)) for col in columns])
    assert loss.grad_fn is None and loss.item() == pytest.approx(expected.item())


def _ddp_worker(rank: int, out_path: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    enc = _encoder()
    x = _data()[0][rank * N // 2 : (rank + 1) * N // 2]  # (N/2, H_IN) per rank
    columns = [_chunks(x), _chunks(x)]
    results = {}
    for cached in (False, True):
        # DDP runs its hooks only for a forward through the wrapper: make that forward the loss.
        class System(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = enc

            def forward(self):
                if cached:
                    return gc.grad_cache_loss(self.enc, columns, _simcse_loss)
                return _simcse_loss([torch.cat([self.enc(c) for c in col]) for col in columns])

        model = DistributedDataParallel(System(), static_graph=True)
        for step in range(2):  # static_graph records the first step, so check the second
            model.zero_grad()
            torch.manual_seed(10 + step)
            model().backward()
        results[cached] = [p.grad.clone() for p in enc.parameters()]
        del model  # its reducer goes before the process group does
    if rank == 0:
        torch.save(results, out_path)


def test_ddp_static_graph_matches_plain_ddp(tmp_path):
    from tests.gloo import run_on_ranks

    out_path = str(tmp_path / "grads.pt")
    run_on_ranks(_ddp_worker, out_path)
    results = torch.load(out_path)
    for g, r in zip(results[True], results[False]):
        assert torch.allclose(g, r, atol=1e-5)
