"""Stage: turn the target's verify logits into the target's own token at every block position.

Greedy rows take the argmax. Sampled rows draw from the target's distribution after temperature,
top-k, top-p and min-p, exactly as plain decoding would for that position; with a point-mass draft
"sample and match" acceptance (accept.py) is then lossless.
"""
from __future__ import annotations

from typing import Optional

import torch


def target_tokens(logits: torch.Tensor, block: int, temperatures: Optional[torch.Tensor] = None,
                  top_ps: Optional[torch.Tensor] = None, top_ks: Optional[torch.Tensor] = None,
                  min_ps: Optional[torch.Tensor] = None, seeds: Optional[list] = None,
                  offsets: Optional[list] = None):
    """logits [bs*B, V]; per-request params [bs] (None = all greedy) -> tokens [bs, B] int64.

    seeds[i] (int or None) makes request i reproducible: the sample at output position
    offsets[i] + j depends only on (seed, position), not on batching or acceptance history."""
    bs = logits.shape[0] // block
    greedy = logits.argmax(dim=-1).view(bs, block)
    if temperatures is None:
        return greedy
    temps = temperatures.reshape(-1).float()
    top_ks_ = top_ks.reshape(-1) if top_ks is not None else torch.full_like(temps, -1, dtype=torch.int64)
    is_greedy = (top_ks_ == 1) | (temps <= 0)
    if bool(is_greedy.all()):
        return greedy
    rep = lambda t: t.reshape(-1).repeat_interleave(block)  # noqa: E731  [bs] -> [bs*B]
    probs = torch.softmax(logits.float() / rep(temps.clamp_min(1e-6))[:, None], dim=-1)
    probs = _filter(probs, rep(top_ks_), rep(top_ps) if top_ps is not None else None,
                    rep(min_ps) if min_ps is not None else None)
    # Exponential race: argmax(p / E), E ~ Exp(1), draws exactly from p (like multinomial) and lets
    # seeded rows bring their own noise.
    noise = torch.empty_like(probs).exponential_()
    for i, seed in enumerate(seeds or ()):
        if seed is not None:
            for j in range(block):
                g = torch.Generator().manual_seed(_mix(int(seed), int(offsets[i]) + j))
                noise[i * block + j] = torch.empty(probs.shape[1]).exponential_(generator=g).to(noise.device)
    sampled = (probs / noise).argmax(dim=-1).view(bs, block)
    return torch.where(is_greedy[:, None], greedy, sampled)


def _mix(seed: int, position: int) -> int:
    return (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) % (1 << 63)


def _filter(probs: torch.Tensor, top_ks: torch.Tensor, top_ps, min_ps) -> torch.Tensor:
    """probs [N, V] -> renormalized probs with top-k / top-p / min-p applied per row."""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[1], device=probs.device)[None, :]
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    k = torch.where(top_ks > 0, top_ks, probs.shape[1])
    keep &= ranks < k[:, None]
    if top_ps is not None:
        keep &= (sorted_p.cumsum(-1) - sorted_p) <= top_ps[:, None]  # as SGLang's sampler
    if min_ps is not None:
        keep &= sorted_p >= (min_ps[:, None] * sorted_p[:, :1])
    keep[:, 0] = True
    sorted_p = sorted_p * keep
    out = torch.zeros_like(probs).scatter_(1, idx, sorted_p)
    return out / out.sum(-1, keepdim=True)
