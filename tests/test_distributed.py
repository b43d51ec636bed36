"""gather_with_grad: two CPU processes (gloo) must reproduce one process holding the global batch."""
from __future__ import annotations

import pytest

import torch
import torch.distributed as dist

from lightning_modules.distributed import gather_with_grad, rank_and_world
from lightning_modules.losses import info_nce_loss
from tests.gloo import WORLD, run_on_ranks

B, H_IN, H, SCALE = 3, 5, 4, 20.0


def _setup():
    # Same encoder and global batch in every process; (2B, H_IN) per column.
    torch.manual_seed(0)
    encoder = torch.nn.Linear(H_IN, H).double()
    anchors, positives, negatives = (torch.randn(WORLD * B, H_IN, dtype=torch.float64) for _ in range(3))
    return encoder, anchors, positives, negatives


def save_ddp_average(encoder: torch.nn.Module, loss: torch.Tensor, rank: int, out_path: str) -> None:
    """What DDP does: average the parameter gradients over the ranks (and here the loss, for the report); rank 0
    saves both."""
    grad = encoder.weight.grad.clone()
    dist.all_reduce(grad)
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    if rank == 0:
        torch.save({"loss": mean_loss / WORLD, "grad": grad / WORLD}, out_path)


def _worker(rank: int, out_path: str) -> None:
    assert rank_and_world() == (rank, WORLD)
    encoder, anchors, positives, negatives = _setup()
    mine = slice(rank * B, (rank + 1) * B)
    a = encoder(anchors[mine])  # (B, H)
    # Each column gathered on its own, then concatenated: hard negatives stay aligned.
    keys = torch.cat([gather_with_grad(encoder(positives[mine])), gather_with_grad(encoder(negatives[mine]))])
    assert keys.shape == (2 * WORLD * B, H)
    labels = rank * B + torch.arange(B)
    loss, _ = info_nce_loss(a, keys, labels, SCALE)
    loss.backward()
    save_ddp_average(encoder, loss, rank, out_path)


def test_gather_is_identity_without_process_group():
    t = torch.randn(2, 3)
    assert rank_and_world() == (0, 1)
    assert gather_with_grad(t) is t


def test_two_process_gather_matches_single_process(tmp_path):
    out_path = str(tmp_path / "rank0.pt")
    run_on_ranks(_worker, out_path)
    result = torch.load(out_path)

    encoder, anchors, positives, negatives = _setup()
    keys = torch.cat([encoder(positives), encoder(negatives)])  # (2 * WORLD * B, H)
    loss, _ = info_nce_loss(encoder(anchors), keys, torch.arange(WORLD * B), SCALE)
    loss.backward()
    assert torch.allclose(result["loss"], loss.detach(), atol=1e-12)
    assert torch.allclose(result["grad"], encoder.weight.grad, atol=1e-12)


# -- n hard negatives per anchor, through GradCache and the Matryoshka sum ---------------------------------
N_NEG, CHUNK, DIMS, WEIGHTS = 3, 2, [4, 2], [1.0, 0.5]
B_NEG = 4  # per device, two GradCache mini-batches of CHUNK


def _negatives_setup():
    torch.manual_seed(0)
    encoder = torch.nn.Linear(H_IN, H).double()
    columns = [torch.randn(WORLD * B_NEG, H_IN, dtype=torch.float64) for _ in range(2 + N_NEG)]  # a, p, n_1..n_3
    return encoder, columns


def _negatives_loss(gather: bool, matryoshka: bool):
    from lightning_modules.losses import matryoshka_loss
    from lightning_modules.ranking import ranking_loss

    def loss_fn(embeddings):  # anchors, positives, negatives 1..n: (B, H) each
        return ranking_loss(embeddings[0], embeddings[1], embeddings[2:], SCALE, gather)[0]

    if not matryoshka:
        return loss_fn
    return lambda embeddings: matryoshka_loss(loss_fn, embeddings, DIMS, WEIGHTS)[0]


def _negatives_worker(rank: int, out_path: str, matryoshka: bool) -> None:
    from lightning_modules.grad_cache import grad_cache_loss

    encoder, columns = _negatives_setup()
    mine = slice(rank * B_NEG, (rank + 1) * B_NEG)
    chunks = [list(c[mine].split(CHUNK)) for c in columns]  # GradCache mini-batches of each local column
    loss = grad_cache_loss(encoder, chunks, _negatives_loss(gather=True, matryoshka=matryoshka))
    loss.backward()
    save_ddp_average(encoder, loss, rank, out_path)


@pytest.mark.parametrize("matryoshka", [False, True], ids=["plain", "matryoshka"])
def test_two_processes_with_three_negatives_and_grad_cache_match_one_process(tmp_path, matryoshka):
    out_path = str(tmp_path / "rank0.pt")
    run_on_ranks(_negatives_worker, out_path, matryoshka)
    result = torch.load(out_path)

    encoder, columns = _negatives_setup()
    # one process, the global batch at once: every anchor ranks its positive among all 4 x 2B candidates
    loss = _negatives_loss(gather=False, matryoshka=matryoshka)([encoder(c) for c in columns])
    loss.backward()
    assert torch.allclose(result["loss"], loss.detach(), atol=1e-12)
    assert torch.allclose(result["grad"], encoder.weight.grad, atol=1e-12)
    # the negatives matter: without them the loss differs
    without = _negatives_loss(gather=False, matryoshka=matryoshka)([encoder(c) for c in columns[:2]])
    assert not torch.allclose(without, loss)


# -- DCLR's mask tally: each step's counts are the global batch's ---------------------------------------------
def _mask_setup():
    torch.manual_seed(0)
    comp_neg = torch.rand(WORLD * B, 7)  # every anchor's complementary cosines to its candidates
    masked = comp_neg > 0.8
    masked[:B] = False  # rank 0's anchors mask nothing; only rank 1's do
    return masked, comp_neg


def _mask_worker(rank: int, out_path: str) -> None:
    from lightning_modules.dclr import mask_counts

    masked, comp_neg = _mask_setup()
    mine = slice(rank * B, (rank + 1) * B)
    counts = mask_counts(masked[mine], comp_neg[mine])
    if rank == 0:
        torch.save(counts, out_path)


def test_two_processes_count_dclr_masks_of_the_global_batch(tmp_path):
    from lightning_modules.dclr import mask_counts

    out_path = str(tmp_path / "rank0.pt")
    run_on_ranks(_mask_worker, out_path)
    masked, comp_neg = _mask_setup()
    one_process = mask_counts(masked, comp_neg)
    assert not masked[:B].any() and masked[B:].any()  # rank 0 alone would report a batch without masks
    assert one_process[2] == 1 and torch.allclose(torch.load(out_path), one_process, atol=1e-7)
    assert one_process[3] / one_process[1] == pytest.approx(comp_neg[masked].mean().item(), abs=1e-6)
