"""The drafter's RoPE table: built once per (device, head_dim, theta), grown on demand, indexed per forward.

Every draft forward and every context write reads rows of this one table, so the block's K and the
context's K (written by the fused op in projection.py) are rotated with identical cos/sin values.
The table is float32 whatever the model dtype: apply_rope rotates in float32, so one table serves
bf16 and float32 drafters alike.
"""

from __future__ import annotations

import torch

from sglang_dflash.kernels.reference import rope_cos_sin_cache

_TABLES: dict[tuple[torch.device, int, float], torch.Tensor] = {}
# First build covers common prompts; growth doubles, so a long request rebuilds O(log P) times.
_MIN_ROWS = 4096


def rope_table(max_pos: int, head_dim: int, theta: float, device) -> torch.Tensor:
    """-> [P >= max_pos, head_dim] float32: cos in the first half, sin in the second (the kernels' layout)."""
    key = (torch.device(device), head_dim, float(theta))
    table = _TABLES.get(key)
    if table is None or table.shape[0] < max_pos:
        rows = max(max_pos, 2 * table.shape[0] if table is not None else _MIN_ROWS)
        # a normal tensor even when first built inside inference_mode: training forwards reuse it
        with torch.inference_mode(False), torch.no_grad():
            table = _TABLES[key] = rope_cos_sin_cache(rows, head_dim, theta, device)
    return table


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """positions [T] -> cos, sin [T, head_dim] float32, each half repeated (neox layout)."""
    top = int(positions.max()) + 1 if positions.numel() else 1
    c, s = rope_table(top, head_dim, theta, positions.device)[positions].chunk(2, dim=-1)
    return torch.cat([c, c], dim=-1), torch.cat([s, s], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos/sin [T, head_dim] -> rotated x (neox style), in x's dtype."""
    half = x.shape[-1] // 2
    x32 = x.float()
    rot = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos[:, None, :] + rot * sin[:, None, :]).to(x.dtype)
