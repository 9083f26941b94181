"""Stage: draft a whole block in ONE non-causal drafter forward, logits from the target's LM head."""
from __future__ import annotations

from typing import Callable

import torch

from sglang_dflash.model.drafter import DFlashDrafter

# attend(layer, q [N, H, D], k_blk [N, Hkv, D], v_blk [N, Hkv, D]) -> [N, H, D]; see attention.py
BlockAttention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@torch.inference_mode()
def draft_block(drafter: DFlashDrafter, attend: BlockAttention, embed: Callable[[torch.Tensor], torch.Tensor],
                logits_fn: Callable[[torch.Tensor], torch.Tensor], block_ids: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
    """block_ids, positions [bs, B]; attend: non-causal attention over context + block per request.
    embed: token ids [N] -> [N, H] (the target's); logits_fn: [N, H] -> [N, V] (the target's LM head).

    Returns draft tokens [bs, B]: column 0 is the anchor (block_ids[:, 0]), columns 1.. the proposals.
    """
    bs, block = block_ids.shape
    x = embed(block_ids.reshape(-1)).to(drafter.fc.weight.dtype)  # [bs*B, H]
    hidden = drafter(x, positions.reshape(-1), attend).view(bs, block, -1)
    logits = logits_fn(hidden[:, 1:, :].reshape(bs * (block - 1), -1))  # [bs*(B-1), V]
    out = block_ids.clone()
    out[:, 1:] = logits.argmax(dim=-1).view(bs, block - 1)
    return out
