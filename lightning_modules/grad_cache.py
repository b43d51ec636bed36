"""GradCache: a contrastive loss over a large batch, encoded a mini-batch at a time.

Gao, Zhang, Han & Callan (2021), "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup" (the idea behind sentence-transformers' CachedMultipleNegativesRankingLoss).
The loss couples every example of the batch, but its gradient factorises through the
embeddings: ``dL/dtheta = sum_chunks (dL/dE_chunk) . (dE_chunk/dtheta)``. So:

1. embed every mini-batch without a graph, saving the RNG state before each one;
2. compute the loss on the concatenated embeddings and its gradient w.r.t. them (cheap);
3. on backward, re-embed each mini-batch with a graph, under its saved RNG state (the same
   dropout masks: SimCSE's positive *is* the dropout noise), and backpropagate the cached
   gradient through it. Only one mini-batch's activations are alive at a time.

Step 3 lives in a custom autograd Function, so the caller just calls ``loss.backward()``
(Lightning's automatic optimisation, an AMP GradScaler scaling the loss) and never knows.
Autocast settings active during the call are restored for the replay, as
``torch.utils.checkpoint`` does, because Lightning runs backward outside autocast.

Under DDP every mini-batch replay is its own backward pass, so each parameter's gradient hook
fires once per mini-batch. DDP's default reducer expects one firing per step and then
synchronises wrong gradients without any error (seen with torch 2.13, gloo). With
``static_graph=True`` (Lightning: ``DDPStrategy(static_graph=True)``) DDP counts the firings
and the gradients are right; tests/test_grad_cache.py checks it on two CPU processes.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor


class _RngState:
    """CPU (and, once CUDA is initialised, every CUDA device's) RNG state at one moment."""

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    @contextlib.contextmanager
    def restored(self) -> Iterator[None]:
        # fork_rng puts the ambient state back afterwards: replaying does not disturb the stream.
        devices = list(range(len(self.cuda))) if self.cuda is not None else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state_all(self.cuda)
            yield


def _autocast_devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def _autocast_state() -> dict[str, tuple[bool, torch.dtype]]:
    return {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _autocast_devices()}


def _autocast_restored(state: dict[str, tuple[bool, torch.dtype]], cache: bool) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for device, (enabled, dtype) in state.items():
        stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled, cache_enabled=cache))
    return stack


class _ReplayEmbeddings(torch.autograd.Function):
    """Identity on the loss whose backward also runs GradCache's step 3."""

    @staticmethod
    def forward(ctx, loss: Tensor, replay: Callable[[Tensor], None]) -> Tensor:
        ctx.replay = replay
        return loss.detach().clone()

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, None]:
        ctx.replay(grad_output)
        # Passing grad_output on reaches any trainable part of loss_fn (a learnable scale).
        return grad_output, None


def grad_cache_loss(
    embed: Callable[[Any], Tensor],
    columns: list[list[Any]],
    loss_fn: Callable[[list[Tensor]], Tensor],
) -> Tensor:
    """``loss_fn`` over the full batch, with the memory of one mini-batch (GradCache).

    embed: maps one mini-batch input (e.g. a tokenized feature dict) to (b, H) embeddings,
        with graph; called twice per mini-batch (without, then with graph), in train mode.
    columns: ``columns[c]`` lists the mini-batch inputs of column c (anchors, positives,
        hard negatives...). The same inputs may appear in two columns (SimCSE); each call
        draws its own dropout.
    loss_fn: maps the per-column embeddings ``[(N_c, H) for c]`` to a scalar loss.

    Returns a scalar equal to the loss; its backward fills the gradients of ``embed``'s (and
    ``loss_fn``'s) parameters exactly as the full-batch computation with the same dropout
    masks would. Under ``torch.no_grad()`` it just computes the loss.
    """
    if not torch.is_grad_enabled():
        return loss_fn([torch.cat([embed(chunk) for chunk in column]) for column in columns])

    # Step 1: embed without graph, remembering the RNG state each mini-batch started from.
    states: list[list[_RngState]] = []
    sizes: list[list[int]] = []
    embeddings: list[Tensor] = []
    with torch.no_grad():
        for column in columns:
            col_states, col_embs = [], []
            for chunk in column:
                col_states.append(_RngState())
                col_embs.append(embed(chunk))  # (b, H)
            states.append(col_states)
            sizes.append([e.shape[0] for e in col_embs])
            embeddings.append(torch.cat(col_embs))  # (N_c, H)

    # Step 2: the loss on leaf copies, and its gradient w.r.t. each column's embeddings.
    leaves = [e.detach().requires_grad_(True) for e in embeddings]
    loss = loss_fn(leaves)
    grads = torch.autograd.grad(loss, leaves, retain_graph=True, allow_unused=True)
    chunk_grads = [
        (torch.zeros_like(leaf) if g is None else g).split(col_sizes)  # b rows per chunk
        for leaf, g, col_sizes in zip(leaves, grads, sizes)
    ]
    autocast_state, autocast_cache = _autocast_state(), torch.is_autocast_cache_enabled()

    # Step 3, run on backward: re-embed with graph, same dropout, push the cached gradient in.
    def replay(grad_output: Tensor) -> None:
        with torch.enable_grad(), _autocast_restored(autocast_state, autocast_cache):
            for column, col_states, col_grads in zip(columns, states, chunk_grads):
                for chunk, state, grad in zip(column, col_states, col_grads):
                    with state.restored():
                        emb = embed(chunk)  # (b, H)
                    torch.autograd.backward(emb, (grad * grad_output).to(emb.dtype))

    return _ReplayEmbeddings.apply(loss, replay)


def split_features(features: dict[str, Tensor], size: int) -> list[dict[str, Tensor]]:
    """Cut a padded (B, L) batch into mini-batches of ``size`` rows, each trimmed of padding columns."""
    chunks = []
    for start in range(0, features["input_ids"].shape[0], size):
        chunk = {k: v[start:start + size] for k, v in features.items()}
        width = int(chunk["attention_mask"].sum(1).max())
        chunks.append({k: v[:, :width] for k, v in chunk.items()})
    return chunks


def embed_columns(
    embed: Callable[[dict[str, Tensor]], Tensor],
    columns: list[dict[str, Tensor]],
    loss_fn: Callable[[list[Tensor]], Tensor],
    mini_batch_size: int | None,
) -> Tensor:
    """``loss_fn`` over the embeddings of each column, directly or through GradCache.

    With ``mini_batch_size`` the batch is embedded in mini-batches without graph, the loss and
    its gradient with respect to the embeddings are computed once, and each mini-batch is
    re-embedded with graph under the same dropout state in the backward pass: the gradients of
    the full batch with the memory of one mini-batch (Gao et al. 2021, GradCache).
    """
    if mini_batch_size is None:
        return loss_fn([embed(c) for c in columns])
    return grad_cache_loss(embed, [split_features(c, mini_batch_size) for c in columns], loss_fn)
