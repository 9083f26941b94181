"""Stage: draft a whole block in ONE non-causal drafter forward, logits from the target's LM head.

DFlash 1: the proposals are the argmax at every block position. DFlash 2: the selector keeps the
top-k candidates per position and path.py walks one path through them from the anchor (best path
for greedy requests; a sampled path with its distribution q for sampled ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.path import best_path, sample_path

# attend(layer, q [N, H, D], k_blk [N, Hkv, D], v_blk [N, Hkv, D]) -> [N, H, D]; see attention.py
BlockAttention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Proposal:
    tokens: torch.Tensor  # [bs, B]: column 0 the anchor, columns 1.. the proposals
    cand_ids: Optional[torch.Tensor] = None  # [bs, B-1, K] DFlash 2 candidates per proposal slot
    q: Optional[torch.Tensor] = None  # [bs, B-1, K] the distribution each sampled slot was drawn from
    q_rows: Optional[torch.Tensor] = None  # [bs] bool: rows drawn from q (verified by rejection); None: all

    def first(self, width: int) -> "Proposal":
        """The first `width` block rows (anchor + width-1 drafts): what a width-W step verifies."""
        if width >= self.tokens.shape[1]:
            return self
        cut = lambda t: None if t is None else t[:, : width - 1]  # noqa: E731
        return Proposal(self.tokens[:, :width], cut(self.cand_ids), cut(self.q), self.q_rows)


@torch.inference_mode()
def propose(
    drafter: DFlashDrafter,
    attend: BlockAttention,
    embed: Callable[[torch.Tensor], torch.Tensor],
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    block_ids: torch.Tensor,
    positions: torch.Tensor,
    temperatures: Optional[torch.Tensor] = None,
    gumbel: Optional[torch.Tensor] = None,
    width: Optional[int] = None,
) -> Proposal:
    """block_ids, positions [bs, B]; attend: non-causal attention over context + block per request.
    embed: token ids [N] -> [N, H] (the target's); logits_fn: [N, H] -> [N, V] (the target's LM head).
    temperatures [bs] (> 0: that row's path is sampled, with its q kept for rejection; <= 0: the
    best path, a point mass) and gumbel [bs, B-1, K] noise: sampled DFlash 2 paths.
    width: the step verifies only the first W rows: the block is drafted whole (the drafter's trained
    size), but a DFlash 1 drafter reads the LM head (a [rows, vocab] matmul) at those W-1 slots only."""
    bs, block = block_ids.shape
    x = embed(block_ids.reshape(-1)).to(drafter.fc.weight.dtype)  # [bs*B, H]
    hidden = drafter(x, positions.reshape(-1), attend, block).view(bs, block, -1)
    selector = drafter.selector
    keep = block if width is None or selector is not None else width  # the selector walks every slot
    slots = hidden[:, 1:keep, :]  # [bs, keep-1, H]
    logits = logits_fn(slots.reshape(bs * (keep - 1), -1)).view(bs, keep - 1, -1)  # [bs, keep-1, V]
    out = block_ids[:, :keep].clone()
    if selector is None:
        out[:, 1:] = logits.argmax(dim=-1)
        return Proposal(out)
    values, cand = selector.candidates(logits)  # [bs, B-1, K]
    edges = selector.edges(block_ids[:, 0], cand, values, slots)  # [bs, B-1, K, K]
    idx, q, rows = best_path(edges), None, None
    if temperatures is not None and bool((temperatures > 0).any()):
        rows = temperatures > 0
        sampled_idx, q = sample_path(edges, temperatures.clamp_min(1e-6), gumbel)
        idx = torch.where(rows[:, None], sampled_idx, idx)
    out[:, 1:] = cand.gather(2, idx[..., None]).squeeze(2)
    return Proposal(out, cand, q, rows)
