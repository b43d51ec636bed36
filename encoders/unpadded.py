"""Padding-free forward of BERT-family encoders: the token-wise layers run on the real tokens only.

A padded batch (B, L) of sentence-embedding data is often half padding (45 % real tokens in random
batches of SNLI pairs at max length 64), and nearly every FLOP of a BERT layer is token-wise: the
QKV, attention-output and feed-forward Linears, LayerNorm, GELU and dropout. Here those layers run
on the packed real tokens (N, H), N = number of real tokens; only the attention score product needs
the per-sequence layout:

- on CUDA in bf16/fp16 without attention dropout, ``torch.nn.attention.varlen.varlen_attn`` (flash,
  variable length) reads the packed tokens directly;
- elsewhere Q, K and V are scattered back into (B, heads, L, d) for ``scaled_dot_product_attention``
  with a key padding mask, and only the real query rows are gathered back out.

The computation is the Hugging Face model's own: its modules and weights are called in the order
its forward calls them (``embeddings``, then per layer ``attention.self.query/key/value``,
``attention.output.dense/dropout/LayerNorm``, ``intermediate.dense`` and its activation,
``output.dense/dropout/LayerNorm``), so checkpoints, export and resume see the same parameters.
Dropout is the same ``nn.Dropout`` on fewer elements: the same distribution per real token, not the
same random draws. Positions restart at each sequence as Hugging Face computes them: the column
index for BERT, ``padding_idx + 1 + rank`` among non-pad ids for RoBERTa. Token type is 0, as the
padded model uses when none is given.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger(__name__)

# Model class -> how its position ids are made. XLM-R shares RoBERTa's embeddings and layers.
FAMILIES: dict[str, Literal["bert", "roberta"]] = {
    "BertModel": "bert", "RobertaModel": "roberta", "XLMRobertaModel": "roberta",
}


def family(model: nn.Module) -> Literal["bert", "roberta"] | None:
    """The position rule of a transformer this module can run padding-free, or None (unknown, or a
    configuration the packed layers do not reproduce: decoder, cross-attention)."""
    kind = FAMILIES.get(type(model).__name__)
    config = getattr(model, "config", None)
    if kind is None or config is None:
        return None
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return None
    if getattr(config, "position_embedding_type", "absolute") != "absolute":  # older transformers' relative kinds
        return None
    return kind


@dataclass
class Packing:
    """Where the N real tokens of a right- or left-padded (B, L) batch sit.

    index: (N,) flat positions in B*L of the real tokens, row-major; seq: (N,) their row; pos: (N,) their
    column; lengths: (B,) real tokens per row; starts: (B,) offset of each row's first token in the packed order.
    """

    index: Tensor
    seq: Tensor
    pos: Tensor
    lengths: Tensor
    starts: Tensor
    batch: int
    width: int

    @classmethod
    def from_mask(cls, mask: Tensor) -> "Packing":
        real = mask.bool()  # (B, L)
        batch, width = real.shape
        index = real.flatten().nonzero().squeeze(1)  # (N,)
        lengths = real.sum(1)  # (B,)
        starts = torch.cumsum(lengths, 0) - lengths  # (B,)
        return cls(index=index, seq=torch.div(index, width, rounding_mode="floor"), pos=index % width,
                   lengths=lengths, starts=starts, batch=batch, width=width)

    def pack(self, x: Tensor) -> Tensor:
        """(B, L, ...) -> (N, ...)."""
        return x.flatten(0, 1)[self.index]

    def unpack(self, x: Tensor, fill: float = 0.0) -> Tensor:
        """(N, ...) -> (B, L, ...), padding positions set to ``fill``."""
        out = x.new_full((self.batch * self.width, *x.shape[1:]), fill)
        # In place on a new tensor: autograd still gathers the gradient back (index_copy_'s backward), and
        # the out-of-place form would copy the whole padded tensor once more.
        out.index_copy_(0, self.index, x)
        return out.view(self.batch, self.width, *x.shape[1:])


def _embed(model: nn.Module, kind: str, input_ids: Tensor, packing: Packing) -> Tensor:
    """The embedding layer on the real tokens: (N, H)."""
    emb = model.embeddings
    if kind == "roberta":
        # Hugging Face's rule: rank among the row's non-pad ids, offset by padding_idx + 1
        not_pad = input_ids.ne(emb.padding_idx).long()  # (B, L)
        positions = torch.cumsum(not_pad, 1) * not_pad + emb.padding_idx
    else:
        positions = torch.arange(packing.width, device=input_ids.device).expand(packing.batch, -1)
    ids, positions = packing.pack(input_ids), packing.pack(positions)  # (N,)
    x = emb.word_embeddings(ids) + emb.token_type_embeddings.weight[0]  # token type 0, as the padded default
    x = x + emb.position_embeddings(positions)
    return emb.dropout(emb.LayerNorm(x))


def _attention(q: Tensor, k: Tensor | None, v: Tensor | None, packing: Packing, mask: Tensor, heads: int,
               dropout: float, scale: float) -> Tensor:
    """Per-sequence attention of packed (N, H) queries, keys, values -> (N, H); with ``k`` and ``v`` None,
    ``q`` holds all three side by side, (N, 3H)."""
    n, hidden = q.shape[0], q.shape[1] // (1 if k is not None else 3)
    d = hidden // heads
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and dropout == 0.0:
        varlen = _varlen_attn()
        if varlen is not None:
            cu = F.pad(torch.cumsum(packing.lengths, 0), (1, 0)).to(torch.int32)  # (B+1,)
            longest = int(packing.lengths.max())
            if k is None:  # fused projections: (N, 3H)
                q, k, v = q.split(hidden, dim=1)
            out = varlen(q.reshape(n, heads, d), k.reshape(n, heads, d), v.reshape(n, heads, d), cu, cu, longest,
                         longest, scale=scale)
            return out.reshape(n, hidden)
    # Re-pad for the score product only: (N, 3H) -> (B, L, 3, heads, d) -> three (B, heads, L, d) views
    qkv = q if k is None else torch.cat([q, k, v], 1)  # (N, 3H): one tensor when the caller fused the projections
    qkv = packing.unpack(qkv).view(packing.batch, packing.width, 3, heads, d)
    qp, kp, vp = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    key_mask = mask.bool()[:, None, None, :]  # (B, 1, 1, L)
    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=key_mask, dropout_p=dropout, scale=scale)
    return out[packing.seq, :, packing.pos].reshape(n, hidden)  # (N, H): the real query rows, gathered at once


def _varlen_attn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _layer(layer: nn.Module, x: Tensor, packing: Packing, mask: Tensor) -> Tensor:
    """One BertLayer (or a RoBERTa copy of it) on packed tokens: (N, H) -> (N, H)."""
    attn = layer.attention.self
    projections = (attn.query, attn.key, attn.value)
    if all(type(p) is nn.Linear and p.bias is not None and not (p._forward_hooks or p._forward_pre_hooks)
           for p in projections):
        # The three projections as one matrix product (N, 3H): the model's own weights, concatenated each call
        # (the gradient reaches each of them), cheaper than concatenating three (N, H) outputs, and one GEMM.
        weight = torch.cat([p.weight for p in projections])  # (3H, H)
        qkv = F.linear(x, weight, torch.cat([p.bias for p in projections]))  # (N, 3H)
    else:  # wrapped or hooked projections (adapters, say): called as modules, as the model calls them
        qkv = torch.cat([p(x) for p in projections], 1)  # (N, 3H)
    dropout = attn.dropout.p if attn.training else 0.0
    scale = getattr(attn, "scaling", attn.attention_head_size ** -0.5)
    context = _attention(qkv, None, None, packing, mask, attn.num_attention_heads, dropout, scale)
    out = layer.attention.output
    h = out.LayerNorm(out.dropout(out.dense(context)) + x)
    ffn = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(h))  # (N, I)
    out = layer.output
    return out.LayerNorm(out.dropout(out.dense(ffn)) + h)


def packed_forward(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Packing]:
    """Last hidden states of the real tokens (N, H) of a padded batch (B, L), and where they sit.

    ``model`` must be of a family ``family`` knows; its train/eval mode decides dropout as usual.
    """
    kind = family(model)
    if kind is None:
        raise ValueError(f"no padding-free path for {type(model).__name__}")
    packing = Packing.from_mask(attention_mask)
    x = _embed(model, kind, input_ids, packing)  # (N, H)
    checkpointing = model.training and _checkpointing(model)
    for layer in model.encoder.layer:
        if checkpointing:
            x = torch.utils.checkpoint.checkpoint(_layer, layer, x, packing, attention_mask, use_reentrant=False)
        else:
            x = _layer(layer, x, packing, attention_mask)
    return x, packing


def _checkpointing(model: nn.Module) -> bool:
    """Whether Hugging Face activation checkpointing is on (the property's name changed in transformers 5)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def pool_packed(tokens: Tensor, packing: Packing, pooling: str) -> Tensor:
    """Sentence vectors (B, H) from packed token states (N, H), as ``SentenceEncoder`` pools padded
    ones: ``mean`` and ``max`` over each row's real tokens, ``cls``/``cls_before_pooler`` its first."""
    if pooling == "mean":
        sums = tokens.new_zeros(packing.batch, tokens.shape[1]).index_add(0, packing.seq, tokens)  # (B, H)
        return sums / packing.lengths.clamp(min=1).unsqueeze(1).to(tokens.dtype)
    if pooling == "max":
        return packing.unpack(tokens, torch.finfo(tokens.dtype).min).amax(1)  # (B, H)
    if pooling in ("cls", "cls_before_pooler"):
        return tokens[packing.starts]  # (B, H) the first real token of each row
    raise ValueError(f"unknown pooling {pooling!r}")
