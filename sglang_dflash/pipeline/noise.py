"""Keyed noise: every random draw of a seeded request, from one place.

A seeded request's draw at output position n in stream s depends only on (seed, n, s), never on
batching or on what was accepted before, so the request is reproducible alone or batched.
Streams: TARGET (the target's sample per block row), ACCEPT (the rejection rule's uniform),
RESIDUAL (the redraw after a rejection), WALK (a DFlash 2 sampled path's Gumbel noise).

The keyed draws are a counter-based hash of (seed, position, stream, element) computed with tensor
ops for all seeded rows at once (no generator per row): 32-bit integer mixing rounds
(Wellons' lowbias32) in int64 tensors, whose low 32 bits wrap identically on CPU and GPU.
Unseeded rows take torch's own generator. A categorical draw needs one uniform per row (inverse
CDF, target_sampling.draw), so the keyed work per step is a few integer ops per block row.
"""

from __future__ import annotations

from typing import Optional

import torch

TARGET, ACCEPT, RESIDUAL, WALK = 0, 1, 2, 3
_M32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """int64 tensor of values in [0, 2^32) -> a well-mixed value in [0, 2^32), elementwise."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """seeds [n] int64 (any 64-bit value); positions [n, P] int64 -> keys [n, P] in [0, 2^32)."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    k = hash32(hash32(lo ^ 0x9E3779B9) ^ hi)[:, None]
    k = hash32(k ^ (positions & _M32))
    return hash32(k ^ ((stream * 0x85EBCA6B + 0x27D4EB2F) & _M32))


def keyed_uniform(keys: torch.Tensor, width: int) -> torch.Tensor:
    """keys [...] -> U(0, 1) [..., width] float64 (53-bit, never 0 or 1), element e from (key, e)."""
    elem = hash32(torch.arange(width, device=keys.device, dtype=torch.int64) + 0x165667B1)
    a = hash32(keys[..., None] ^ elem)
    b = hash32(a ^ ((keys[..., None] * 0x27D4EB2F + 0x61C88647) & _M32))
    return (((a >> 5) << 26 | (b >> 6)).to(torch.float64) + 0.5) * (1.0 / (1 << 53))


def uniform(
    bs: int, block: int, width: int, seeds: Optional[list], offsets: Optional[list], stream: int, device
) -> torch.Tensor:
    """U(0, 1) float64 [bs, block, width]; rows of seeded requests come from (seed, position, stream),
    the others from torch's generator."""
    u = torch.rand(bs, block, width, device=device, dtype=torch.float64).clamp_min_(2.0**-60)
    rows = [i for i, s in enumerate(seeds or ()) if s is not None]
    if rows:
        i64 = dict(dtype=torch.int64, device=device)
        seed_t = torch.tensor([_signed64(int(seeds[i])) for i in rows], **i64)
        start = torch.tensor([int(offsets[i]) for i in rows], **i64)
        positions = start[:, None] + torch.arange(block, **i64)[None, :]  # [n, block]
        u[torch.tensor(rows, device=device)] = keyed_uniform(row_keys(seed_t, positions, stream), width)
    return u


def _signed64(seed: int) -> int:
    """Any Python int -> the int64 with the same low 64 bits."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def gumbel(
    bs: int, block: int, width: int, seeds: Optional[list], offsets: Optional[list], stream: int, device
) -> torch.Tensor:
    """Gumbel(0, 1) noise [bs, block, width] float32, keyed like uniform()."""
    return -torch.log(-torch.log(uniform(bs, block, width, seeds, offsets, stream, device))).float()
