"""Run a function on two CPU processes that share one gloo process group, as DDP's ranks do.

``run_on_ranks(fn, *args)`` calls ``fn(rank, *args)`` in each process and returns once every rank returned; a
rank that raises or dies fails the caller with ``ProcessExitedException``. Every test that compares DDP with one
process goes through it, so the group's set-up and teardown are written once.
"""
from __future__ import annotations

import faulthandler
import socket
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank: int, port: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    # A rank killed by a signal (a C++ abort inside the backend) prints every thread's Python stack to the stderr
    # that pytest shows, so a failure names where it happened.
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        fn(rank, *args)
        dist.barrier()  # neither rank tears the group down while the other still uses it
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn: Callable[..., None], *args: Any) -> None:
    # spawn, not fork: a forked child inherits the parent's OpenMP pool and can hang in it.
    mp.start_processes(_rank_entry, args=(free_port(), fn, args), nprocs=WORLD, join=True, start_method="spawn")
