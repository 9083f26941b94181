"""The drafter's RoPE table: one per (device, head_dim, theta), sized before any step, indexed per forward.

Every draft forward and every context write reads rows of this one table, so the block's K and the
context's K (written by the fused op in projection.py) are rotated with identical cos/sin values.
The table is float32 whatever the model dtype: apply_rope rotates in float32, so one table serves
bf16 and float32 drafters alike.

A draft step reads the table as it stands (rope_cos_sin) and never sizes it: sizing needs the
largest position on the host, and a captured draft step may read nothing back from the device.
A captured step also holds the table's address, so the table must not be rebuilt after capture:
a server sizes it once at start-up to its context length + one block (DFlashDrafter.rope_table),
which every later request fits; outside a server, each context write (grow_for) covers its
positions plus the block drafted after them.
"""

from __future__ import annotations

import torch

from sglang_dflash.kernels.reference import rope_cos_sin_cache

_TABLES: dict[tuple[torch.device, int, float], torch.Tensor] = {}
# First build covers common prompts; growth doubles, so a long request rebuilds O(log P) times.
_MIN_ROWS = 4096


def _key(device, head_dim: int, theta: float) -> tuple[torch.device, int, float]:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:  # "cuda" and "cuda:0" must name the same table
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev, head_dim, float(theta)


def rope_table(max_pos: int, head_dim: int, theta: float, device) -> torch.Tensor:
    """-> [P >= max_pos, head_dim] float32: cos in the first half, sin in the second (the kernels' layout).
    Host work: call it outside captured steps (start-up, context writes)."""
    key = _key(device, head_dim, theta)
    table = _TABLES.get(key)
    if table is None or table.shape[0] < max_pos:
        rows = max(max_pos, 2 * table.shape[0] if table is not None else _MIN_ROWS)
        # a normal tensor even when first built inside inference_mode: training forwards reuse it
        with torch.inference_mode(False), torch.no_grad():
            table = _TABLES[key] = rope_cos_sin_cache(rows, head_dim, theta, device)
    return table


def grow_for(positions: torch.Tensor, ahead: int, head_dim: int, theta: float) -> torch.Tensor:
    """positions [T]: the table grown to cover them and the `ahead` positions after the last one.
    Reads positions.max() back to the host: context writes only, never a draft step."""
    top = int(positions.max()) + 1 if positions.numel() else 1
    return rope_table(top + ahead, head_dim, theta, positions.device)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """positions [T] -> cos, sin [T, head_dim] float32, each half repeated (neox layout).
    Indexes the table as it stands (no host read): its owner sized it to cover these positions."""
    table = _TABLES.get(_key(positions.device, head_dim, theta))
    if table is None:
        table = rope_table(_MIN_ROWS, head_dim, theta, positions.device)
    c, s = table[positions].chunk(2, dim=-1)
    return torch.cat([c, c], dim=-1), torch.cat([s, s], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos/sin [T, head_dim] -> rotated x (neox style), in x's dtype."""
    half = x.shape[-1] // 2
    x32 = x.float()
    rot = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos[:, None, :] + rot * sin[:, None, :]).to(x.dtype)
