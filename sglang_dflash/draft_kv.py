"""The drafter's context KV cache, indexed by the TARGET's slot ids (radix-cache safe).

Every drafter layer keeps one K and one V row per target KV slot. A slot's row is written when the
target commits that token (prefill or accepted verify rows), so a prefix-cache hit on the target
finds the drafter's context already in place.
"""
from __future__ import annotations

import torch


class DraftKVCache:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: str):
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
