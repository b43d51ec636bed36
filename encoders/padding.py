"""The one padding rule of training batches, validation batches and ``SentenceEncoder.encode``.

It lives with the encoders because the encoders need it; the data modules import it from here.
"""
from __future__ import annotations

from typing import Sequence

import torch


def pad_token_ids(rows: Sequence[Sequence[int]], pad_id: int, multiple: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` (B, L) from token id lists: the one padding
    rule of training batches, validation batches and ``SentenceEncoder.encode``. ``multiple`` rounds
    the width L up to a multiple of it, so a compiled model sees few distinct shapes."""
    width = max(len(r) for r in rows)
    width = -(-width // multiple) * multiple
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, L)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask}
