"""Stage: target features -> projected context -> the drafter's context KV, indexed by the TARGET's
slot ids (radix-cache safe).

Every drafter layer keeps one K and one V row per target KV slot. A slot's row is written when the
target commits that token (prefill or accepted verify rows), so a prefix-cache hit on the target
finds the drafter's context already in place.
"""

from __future__ import annotations

import torch

from sglang_dflash.kernels import ops
from sglang_dflash.model.drafter import DFlashDrafter


class DraftKVCache:
    def __init__(
        self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: str
    ):
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


@torch.inference_mode()
def write_context(
    drafter: DFlashDrafter,
    cache: DraftKVCache,
    features: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    max_position: int | None = None,
) -> None:
    """features [T, K*H] target hidden states at target_layer_ids; positions [T]; slots [T].
    max_position: a host bound > every position (decode: context length + B), saving the device sync
    of reading positions.max(); the kernel rejects a position past the table either way."""
    if slots.numel() == 0:
        return
    k, v = drafter.context_kv_pre(features)  # [L, T, kv_heads, head_dim] each, before k_norm / RoPE
    table = drafter.rope_table(max_position or int(positions.max()) + 1, positions.device)
    ops().write_draft_kv(
        k,
        v,
        drafter._k_norm_weight,
        table,
        positions.to(torch.int64),
        slots.to(torch.int64),
        cache.k,
        cache.v,
        drafter.cfg.rms_norm_eps,
        True,
        1.0,
    )
