"""Stage: turn the target's verify logits into the target's own token at every block position.

Every rule yields target_tokens[i, j] = what the TARGET emits after block position j; accept.py
accepts while draft[i, j + 1] == target_tokens[i, j]. Losslessness per rule:
- greedy rows: the argmax.
- sampled rows, point-mass draft (DFlash 1, or any draft without q): a sample from the target's
  distribution after temperature, top-k, top-p and min-p, exactly as plain decoding draws it
  ("sample and match").
- sampled rows whose draft carries its own distribution q (the DFlash 2 selector): speculative
  rejection sampling. Draft x = d[j + 1] is kept with probability min(1, p(x) / q(x)); otherwise
  the row's token is drawn from the residual max(0, p - q) (normalized), which never equals x.
  The last row (bonus) is a plain sample from p.
Penalties are applied to the logits before this stage (penalties.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang_dflash.pipeline.draft import Proposal

from sglang_dflash.pipeline.noise import ACCEPT, RESIDUAL, TARGET, exponential


@dataclass
class SamplingRows:
    """Per-request sampling parameters of a batch (filled from SGLang's batch by batch_sampling)."""

    temperatures: torch.Tensor  # [bs] float32; 0 for greedy rows (incl. top_k == 1)
    top_ps: Optional[torch.Tensor] = None  # [bs]
    top_ks: Optional[torch.Tensor] = None  # [bs] (-1 or >= vocab: off)
    min_ps: Optional[torch.Tensor] = None  # [bs]
    seeds: Optional[list] = None  # [bs] int or None: seeded rows draw keyed noise
    offsets: Optional[list] = None  # [bs] output position of block row 0


def target_tokens(
    logits: torch.Tensor, block: int, sampling: Optional[SamplingRows] = None, proposal: Optional[Proposal] = None
) -> torch.Tensor:
    """logits [bs*B, V] -> the target's token after every block position [bs, B] int64.

    sampling None: every row greedy. sampling.seeds[i] makes request i reproducible: the noise at
    output position offsets[i] + j depends only on (seed, position), not on batching or acceptance
    history. A proposal with q (DFlash 2 sampled paths) is verified by rejection against q in its
    q_rows; its other rows (point-mass drafts) by sample-and-match."""
    bs = logits.shape[0] // block
    greedy = logits.argmax(dim=-1).view(bs, block)
    if sampling is None:
        return greedy
    temps = sampling.temperatures.reshape(-1).float()
    top_ks, top_ps, min_ps = sampling.top_ks, sampling.top_ps, sampling.min_ps
    seeds, offsets = sampling.seeds, sampling.offsets
    top_ks_ = top_ks.reshape(-1) if top_ks is not None else torch.full_like(temps, -1, dtype=torch.int64)
    is_greedy = (top_ks_ == 1) | (temps <= 0)
    if bool(is_greedy.all()):
        return greedy
    rep = lambda t: t.reshape(-1).repeat_interleave(block)  # noqa: E731  [bs] -> [bs*B]
    probs = torch.softmax(logits.float() / rep(temps.clamp_min(1e-6))[:, None], dim=-1)
    probs = _filter(
        probs, rep(top_ks_), rep(top_ps) if top_ps is not None else None, rep(min_ps) if min_ps is not None else None
    )
    # Exponential race: argmax(p / E), E ~ Exp(1), draws exactly from p (like multinomial) and lets
    # seeded rows bring their own noise.
    sampled = race(probs, exponential(bs, block, probs.shape[1], seeds, offsets, TARGET, probs.device))
    sampled = sampled.view(bs, block)
    if proposal is not None and proposal.q is not None:
        rejected = _rejection(
            probs.view(bs, block, -1), sampled, proposal.tokens, proposal.cand_ids, proposal.q, seeds, offsets
        )
        rows = proposal.q_rows
        sampled = rejected if rows is None else torch.where(rows.reshape(-1, 1), rejected, sampled)
    return torch.where(is_greedy[:, None], greedy, sampled)


def _rejection(probs, sampled, draft, cand_ids, q, seeds, offsets):
    """probs [bs, B, V] target; sampled [bs, B] plain target samples; draft [bs, B];
    cand_ids, q [bs, B-1, K] -> tokens [bs, B] under the speculative rejection rule."""
    bs, block, vocab = probs.shape
    q_dense = torch.zeros(bs, block - 1, vocab, device=probs.device).scatter_(2, cand_ids, q.float())
    x = draft[:, 1:].to(torch.int64)[..., None]
    p_x, q_x = probs[:, :-1].gather(2, x).squeeze(2), q_dense.gather(2, x).squeeze(2)
    u = torch.exp(-exponential(bs, block - 1, 1, seeds, offsets, ACCEPT, probs.device).squeeze(2))  # U(0, 1)
    accept = (q_x > 0) & (u * q_x <= p_x)
    residual = (probs[:, :-1] - q_dense).clamp_min(0)
    empty = residual.sum(-1, keepdim=True) <= 0  # p == q: never rejected in exact arithmetic
    residual = torch.where(empty, probs[:, :-1], residual)
    redraw = race(
        residual.reshape(-1, vocab), exponential(bs, block - 1, vocab, seeds, offsets, RESIDUAL, probs.device)
    ).view(bs, block - 1)
    out = sampled.clone()
    out[:, :-1] = torch.where(accept, x.squeeze(2), redraw)
    return out


def race(weights: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """weights [N, V] >= 0 (unnormalized ok); noise Exp(1) [N, V] (or [bs, B, V]) -> [N] draws."""
    return (weights / noise.reshape(weights.shape)).argmax(dim=-1)


def _filter(probs: torch.Tensor, top_ks: torch.Tensor, top_ps, min_ps) -> torch.Tensor:
    """probs [N, V] -> renormalized probs with top-k / top-p / min-p applied per row."""
    vocab = probs.shape[1]
    active = bool(((top_ks > 0) & (top_ks < vocab)).any())
    active |= top_ps is not None and bool((top_ps < 1).any())
    active |= min_ps is not None and bool((min_ps > 0).any())
    if not active:  # nothing to cut: skip the vocabulary sort (draws use argmax(p / E): no renormalizing)
        return probs
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
