"""Stage: draft a whole block in ONE non-causal drafter forward, logits from the target's LM head."""
from __future__ import annotations

from typing import Callable

import torch

from sglang_dflash.attention import block_draft_attention
from sglang_dflash.draft_kv import DraftKVCache
from sglang_dflash.model.drafter import DFlashDrafter


@torch.inference_mode()
def draft_block(drafter: DFlashDrafter, cache: DraftKVCache, embed: Callable[[torch.Tensor], torch.Tensor],
                logits_fn: Callable[[torch.Tensor], torch.Tensor], block_ids: torch.Tensor,
                positions: torch.Tensor, ctx_slots: list[torch.Tensor]) -> torch.Tensor:
    """block_ids, positions [bs, B]; ctx_slots[i] [prefix_i] committed slot ids of request i.
    embed: token ids [N] -> [N, H] (the target's); logits_fn: [N, H] -> [N, V] (the target's LM head).

    Returns draft tokens [bs, B]: column 0 is the anchor (block_ids[:, 0]), columns 1.. the proposals.
    """
    bs, block = block_ids.shape
    x = embed(block_ids.reshape(-1)).to(drafter.fc.weight.dtype)  # [bs*B, H]
    scale = drafter.cfg.head_dim ** -0.5

    def attend_for_layer(i: int):
        return lambda q, k, v: block_draft_attention(q, k, v, cache.k[i], cache.v[i], ctx_slots, block, scale)

    hidden = drafter(x, positions.reshape(-1), attend_for_layer).view(bs, block, -1)
    logits = logits_fn(hidden[:, 1:, :].reshape(bs * (block - 1), -1))  # [bs*(B-1), V]
    out = block_ids.clone()
    out[:, 1:] = logits.argmax(dim=-1).view(bs, block - 1)
    return out
