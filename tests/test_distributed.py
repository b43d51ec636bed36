"""gather_with_grad: two CPU processes (gloo) must reproduce one process holding the global batch."""
from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_modules.distributed import gather_with_grad, rank_and_world
from lightning_modules.losses import info_nce_loss

B, H_IN, H, WORLD, SCALE = 3, 5, 4, 2, 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup():
    # Same encoder and global batch in every process; (2B, H_IN) per column.
    torch.manual_seed(0)
    encoder = torch.nn.Linear(H_IN, H).double()
    anchors, positives, negatives = (torch.randn(WORLD * B, H_IN, dtype=torch.float64) for _ in range(3))
    return encoder, anchors, positives, negatives


def _worker(rank: int, port: int, out_path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
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
        # What DDP does: average parameter gradients (and here the loss, for the report).
        grad = encoder.weight.grad.clone()
        dist.all_reduce(grad)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        if rank == 0:
            torch.save({"loss": mean_loss / WORLD, "grad": grad / WORLD}, out_path)
    finally:
        dist.destroy_process_group()


def test_gather_is_identity_without_process_group():
    t = torch.randn(2, 3)
    assert rank_and_world() == (0, 1)
    assert gather_with_grad(t) is t


def test_two_process_gather_matches_single_process(tmp_path):
    out_path = str(tmp_path / "rank0.pt")
    # spawn, not fork: a forked child inherits the parent's OpenMP pool and can hang in it.
    mp.start_processes(_worker, args=(_free_port(), out_path), nprocs=WORLD, join=True, start_method="spawn")
    result = torch.load(out_path)

    encoder, anchors, positives, negatives = _setup()
    keys = torch.cat([encoder(positives), encoder(negatives)])  # (2 * WORLD * B, H)
    loss, _ = info_nce_loss(encoder(anchors), keys, torch.arange(WORLD * B), SCALE)
    loss.backward()
    assert torch.allclose(result["loss"], loss.detach(), atol=1e-12)
    assert torch.allclose(result["grad"], encoder.weight.grad, atol=1e-12)
