"""Stage: target features -> projected context -> drafter KV rows at the target's slot ids."""
from __future__ import annotations

import torch

from sglang_dflash.draft_kv import DraftKVCache
from sglang_dflash.kernels import ops
from sglang_dflash.model.drafter import DFlashDrafter


@torch.inference_mode()
def write_context(drafter: DFlashDrafter, cache: DraftKVCache, features: torch.Tensor,
                  positions: torch.Tensor, slots: torch.Tensor) -> None:
    """features [T, K*H] target hidden states at target_layer_ids; positions [T]; slots [T]."""
    if slots.numel() == 0:
        return
    k, v = drafter.context_kv_pre(features)  # [L, T, kv_heads, head_dim] each, before k_norm / RoPE
    table = drafter.rope_table(int(positions.max()) + 1, positions.device)
    ops().write_draft_kv(k, v, drafter._k_norm_weight, table, positions.to(torch.int64),
                         slots.to(torch.int64), cache.k, cache.v, drafter.cfg.rms_norm_eps, True, 1.0)

