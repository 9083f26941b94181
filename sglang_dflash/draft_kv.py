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

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]

    def write(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """k, v [L, T, kv_heads, head_dim]; slots [T] target slot ids. All layers at once."""
        if slots.numel() == 0:
            return
        if int(slots.max()) >= self.num_slots or int(slots.min()) < 0:
            raise IndexError(f"draft KV slot out of range: [{int(slots.min())}, {int(slots.max())}] "
                             f"for {self.num_slots} slots")
        self.k.index_copy_(1, slots, k.to(self.k.dtype))
        self.v.index_copy_(1, slots, v.to(self.v.dtype))
