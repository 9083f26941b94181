"""Keyed noise: every random draw of a seeded request, from one place.

A seeded request's draw at output position n in stream s depends only on (seed, n, s), never on
batching or on what was accepted before, so the request is reproducible alone or batched.
Streams: TARGET (the target's sample per block row), ACCEPT (the rejection rule's uniform),
RESIDUAL (the redraw after a rejection), WALK (a DFlash 2 sampled path's Gumbel noise).
"""

from __future__ import annotations

from typing import Optional

import torch

TARGET, ACCEPT, RESIDUAL, WALK = 0, 1, 2, 3


def exponential(
    bs: int, block: int, width: int, seeds: Optional[list], offsets: Optional[list], stream: int, device
) -> torch.Tensor:
    """Exp(1) noise [bs, block, width]; rows of seeded requests come from (seed, position, stream)."""
    noise = torch.empty(bs, block, width, device=device).exponential_()
    for i, seed in enumerate(seeds or ()):
        if seed is not None:
            for j in range(block):
                g = torch.Generator().manual_seed(_mix(int(seed), int(offsets[i]) + j, stream))
                noise[i, j] = torch.empty(width).exponential_(generator=g).to(device)
    return noise


def _mix(seed: int, position: int, stream: int = 0) -> int:
    return (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + stream * 0x94D049BB133111EB) % (1 << 63)


def gumbel(
    bs: int, block: int, width: int, seeds: Optional[list], offsets: Optional[list], stream: int, device
) -> torch.Tensor:
    """Gumbel(0, 1) noise [bs, block, width], keyed like exponential()."""
    return -torch.log(exponential(bs, block, width, seeds, offsets, stream, device))
