"""Stage: build the draft block [last verified token, MASK x (B-1)] and its positions."""

from __future__ import annotations

import torch


def build_block(bonus: torch.Tensor, prefix_lens: torch.Tensor, block: int, mask_token_id: int):
    """bonus [bs] last verified token; prefix_lens [bs] committed lengths ->
    block_ids [bs, B] (int64), positions [bs, B] (int64; continue each sequence)."""
    bs = bonus.shape[0]
    ids = torch.full((bs, block), mask_token_id, dtype=torch.int64, device=bonus.device)
    ids[:, 0] = bonus
    positions = prefix_lens.to(torch.int64)[:, None] + torch.arange(block, device=bonus.device)[None, :]
    return ids, positions


def block_slots(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, block: int
) -> torch.Tensor:
    """Target slot ids reserved for the block: req_to_token [R, max_len] -> [bs, B] int64."""
    cols = prefix_lens.to(torch.int64)[:, None] + torch.arange(block, device=prefix_lens.device)[None, :]
    return req_to_token[req_pool_indices.to(torch.int64)[:, None], cols].to(torch.int64)
