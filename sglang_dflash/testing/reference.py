"""Test-only references for the stages (plain loops and greedy wrappers), kept out of serving code."""

from __future__ import annotations

import torch

from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.pipeline.draft import BlockAttention, propose


def draft_block(
    drafter: DFlashDrafter, attend: BlockAttention, embed, logits_fn, block_ids: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Greedy proposal tokens [bs, B] (see propose)."""
    return propose(drafter, attend, embed, logits_fn, block_ids, positions).tokens


def path_score(edges: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Total score of paths idx [bs, P] through edges [bs, P, K, K] -> [bs]."""
    bs, p = idx.shape
    rows = torch.arange(bs, device=edges.device)
    total = edges[rows, 0, 0, idx[:, 0]]
    for j in range(1, p):
        total = total + edges[rows, j, idx[:, j - 1], idx[:, j]]
    return total


def conv_reference(x: torch.Tensor, base: torch.Tensor, delta: torch.Tensor, group: int, block: int) -> torch.Tensor:
    """Plain-loop reference for one side: x [N, H]; base [taps, H]; delta [N, taps, H/group] -> [N, H]."""
    n, h = x.shape
    taps = base.shape[0]
    out = torch.zeros_like(x)
    for i in range(n):
        for c in range(h):
            acc = 0.0
            for t in range(taps):
                if i % block >= t:
                    acc += (base[t, c] + delta[i, t, c // group]) * x[i - t, c]
            out[i, c] = acc
    return out
