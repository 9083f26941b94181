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

from sglang_dflash.pipeline.noise import ACCEPT, RESIDUAL, TARGET, uniform


def samples(temperature, top_k):
    """The one definition of a row that samples; every other row is greedy (draws the argmax):
    temperature > 0 and top_k != 1. Host scalars and [bs] tensors alike."""
    return (temperature > 0) & (top_k != 1)


@dataclass
class SamplingRows:
    """Per-request sampling parameters of a batch (filled from SGLang's batch by srt/step_inputs.py)."""

    temperatures: torch.Tensor  # [bs] float32; 0 for greedy rows (not samples(): incl. top_k == 1)
    top_ps: Optional[torch.Tensor] = None  # [bs]
    top_ks: Optional[torch.Tensor] = None  # [bs] (-1 or >= vocab: off)
    min_ps: Optional[torch.Tensor] = None  # [bs]
    seeds: Optional[list] = None  # [bs] int or None: seeded rows draw keyed noise
    offsets: Optional[list] = None  # [bs] output position of block row 0
    # SGLang's FlashInfer sampler, in a batch where some row uses min-p, renormalizes after top-k and
    # cuts top-p on that (top_k_renorm_prob -> top_p_renorm_prob -> min-p); its other paths (and the
    # torch sampler SGLang runs on CPU) cut top-k and top-p jointly on the unrenormalized mass.
    top_k_first: bool = False
    sampled: Optional[list] = None  # [bs] host-side bool: samples() of the row


def target_tokens(
    logits: torch.Tensor, block: int, sampling: Optional[SamplingRows] = None, proposal: Optional[Proposal] = None
) -> torch.Tensor:
    """logits [bs*B, V] -> the target's token after every block position [bs, B] int64.

    sampling None: every row greedy. sampling.seeds[i] makes request i reproducible: the noise at
    output position offsets[i] + j depends only on (seed, position), not on batching or acceptance
    history. A proposal with q (DFlash 2 sampled paths) is verified by rejection against q in its
    q_rows; its other rows (point-mass drafts) by sample-and-match."""
    bs = logits.shape[0] // block
    if sampling is None:
        return logits.argmax(dim=-1).view(bs, block)
    temps = sampling.temperatures.reshape(-1).float().to(logits.device)
    top_ks, top_ps, min_ps = sampling.top_ks, sampling.top_ps, sampling.min_ps
    seeds, offsets = sampling.seeds, sampling.offsets
    top_ks_ = top_ks.reshape(-1) if top_ks is not None else torch.full_like(temps, -1, dtype=torch.int64)
    is_greedy = ~samples(temps, top_ks_)
    if bool(is_greedy.all()):
        return logits.argmax(dim=-1).view(bs, block)
    rep = lambda t: None if t is None else t.reshape(-1).repeat_interleave(block)  # noqa: E731  [bs] -> [bs*B]
    inv_t, ks, ps, mps = rep(1.0 / temps.clamp_min(1e-6)), rep(top_ks_), rep(top_ps), rep(min_ps)
    unit = bool((temps == 1).all())  # the OpenAI default: no scaling pass
    want_greedy = bool(is_greedy.any())
    keep = proposal is not None and proposal.q is not None  # rejection needs every row's p
    u = uniform(bs, block, 1, seeds, offsets, TARGET, logits.device).reshape(-1)
    n, vocab = logits.shape
    sampled = torch.empty(n, dtype=torch.int64, device=logits.device)
    greedy = torch.empty_like(sampled) if want_greedy else None
    probs_all = torch.empty(n, vocab, device=logits.device) if keep else None
    # Row chunks that stay in cache: float conversion, softmax, filter and draw per chunk avoid
    # whole-tensor passes over [bs * W, V] that spill the cache on CPU.
    for a in range(0, n, CHUNK_ROWS):
        b = min(n, a + CHUNK_ROWS)
        chunk = logits[a:b]
        lf = chunk.float()  # torch's CPU argmax is vectorized for float32, not for bf16
        if want_greedy:
            greedy[a:b] = lf.argmax(dim=-1)
        if not unit:  # in place unless .float() returned the caller's own tensor
            lf = lf.mul_(inv_t[a:b, None]) if lf.data_ptr() != chunk.data_ptr() else lf * inv_t[a:b, None]
        probs = _filter(torch.softmax(lf, dim=-1), ks[a:b], _part(ps, a, b), _part(mps, a, b), sampling.top_k_first)
        # Inverse CDF with one uniform per row: exact like multinomial; seeded rows bring their own.
        sampled[a:b] = draw(probs, u[a:b])
        if keep:
            probs_all[a:b] = probs
    sampled = sampled.view(bs, block)
    greedy = None if greedy is None else greedy.view(bs, block)
    if proposal is not None and proposal.q is not None:
        rejected = _rejection(
            probs_all.view(bs, block, -1), sampled, proposal.tokens, proposal.cand_ids, proposal.q, seeds, offsets
        )
        # A row whose q is not finite is never verified against it (its residual would be NaN and
        # the draw arbitrary): sample-and-match keeps it exact whatever its draft tokens are.
        rows = torch.isfinite(proposal.q).flatten(1).all(dim=1)
        rows = rows if proposal.q_rows is None else rows & proposal.q_rows.reshape(-1)
        sampled = torch.where(rows.reshape(-1, 1), rejected, sampled)
    return sampled if greedy is None else torch.where(is_greedy[:, None], greedy, sampled)


CHUNK_ROWS = 16


def _part(t, a, b):
    return None if t is None else t[a:b]


def _rejection(probs, sampled, draft, cand_ids, q, seeds, offsets):
    """probs [bs, B, V] target; sampled [bs, B] plain target samples; draft [bs, B];
    cand_ids, q [bs, B-1, K] -> tokens [bs, B] under the speculative rejection rule."""
    bs, block, vocab = probs.shape
    q_dense = torch.zeros(bs, block - 1, vocab, device=probs.device).scatter_(2, cand_ids, q.float())
    x = draft[:, 1:].to(torch.int64)[..., None]
    p_x, q_x = probs[:, :-1].gather(2, x).squeeze(2), q_dense.gather(2, x).squeeze(2)
    u = uniform(bs, block - 1, 1, seeds, offsets, ACCEPT, probs.device).squeeze(2)
    accept = (q_x > 0) & (u * q_x <= p_x)
    residual = _residual(probs[:, :-1], q_dense)
    empty = residual.sum(-1, keepdim=True) <= 0  # p == q: never rejected in exact arithmetic
    residual = torch.where(empty, probs[:, :-1], residual)
    redraw = draw(residual.reshape(-1, vocab), uniform(bs, block - 1, 1, seeds, offsets, RESIDUAL, probs.device))
    redraw = redraw.view(bs, block - 1)
    out = sampled.clone()
    out[:, :-1] = torch.where(accept, x.squeeze(2), redraw)
    return out


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where a rejected draft is redrawn from: max(0, p - q), unnormalized (draw() normalizes)."""
    return (p - q).clamp_min(0)


def draw(weights: torch.Tensor, u: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """weights [N, V] >= 0 (unnormalized ok, some > 0 per row); u U(0, 1) [N] (any shape of N) -> [N]
    draws by inverse CDF, in two levels so only one chunk per row is scanned in float64: pick the
    chunk by the cumulative chunk sums, then the index inside it. Index i is drawn when
    cdf[i-1] < u * total <= cdf[i], so a zero weight is never drawn (its cdf step is empty)."""
    n, vocab = weights.shape
    pad = -vocab % chunk
    w = torch.nn.functional.pad(weights, (0, pad)) if pad else weights
    w = w.view(n, -1, chunk)  # [N, C, chunk]
    csum = w.sum(-1).double().cumsum(-1)  # [N, C]
    target = u.reshape(-1, 1).to(csum.dtype) * csum[:, -1:]
    c = torch.searchsorted(csum, target).clamp_(max=w.shape[1] - 1)  # [N, 1]
    below = torch.where(c > 0, csum.gather(1, (c - 1).clamp_min(0)), 0.0)
    inner = w[torch.arange(n, device=w.device), c.squeeze(1)].double().cumsum(-1)  # [N, chunk]
    rest = torch.minimum(target - below, inner[:, -1:])  # > 0; capped at the chunk's own total
    i = torch.searchsorted(inner, rest).clamp_(max=chunk - 1)
    return (c * chunk + i).squeeze(1).clamp_(max=vocab - 1)


_NUCLEUS_HEAD = 1024


def _cut(out, rows, vals, cand, top_ks, top_ps, min_ps, top_k_first=False) -> None:
    """out [N, V]: rows [n] replaced by their kept prefix. vals, cand [n, K]: each row's K most likely
    tokens in descending order, K long enough to hold everything the row keeps. top_k_first: top-p
    is cut on the mass renormalized over the row's top-k (SamplingRows.top_k_first)."""
    if rows.numel() == 0:
        return
    keep = torch.ones_like(vals, dtype=torch.bool)
    if top_ks is not None:
        keep &= torch.arange(vals.shape[1], device=vals.device)[None, :] < top_ks[:, None]
    if top_ps is not None:
        scale = (vals * keep).sum(-1, keepdim=True) if top_k_first and top_ks is not None else 1.0
        keep &= (vals.cumsum(-1) - vals) <= top_ps[rows, None] * scale
    if min_ps is not None:
        keep &= vals >= min_ps[rows, None] * vals[:, :1]
    keep[:, 0] = True
    out[rows] = torch.zeros_like(out[rows]).scatter_(1, cand, vals * keep)


def _filter(probs: torch.Tensor, top_ks: torch.Tensor, top_ps, min_ps, top_k_first: bool = False) -> torch.Tensor:
    """probs [N, V] -> renormalized probs with top-k / top-p / min-p applied per row.

    Each rule keeps a prefix of the row in descending order (top-p by the mass before a token, as
    SGLang's sampler), so they combine as the shortest prefix. Rows cost only what they use: min-p
    alone is a threshold (no sort), top-k rows take a partial top-k, and only rows with top-p but no
    top-k sort the vocabulary."""
    n, vocab = probs.shape
    k_on = (top_ks > 0) & (top_ks < vocab)
    p_on = (top_ps < 1) if top_ps is not None else torch.zeros_like(k_on)
    m_on = (min_ps > 0) if min_ps is not None else torch.zeros_like(k_on)
    if not bool((k_on | p_on | m_on).any()):  # nothing to cut (draw() takes unnormalized weights)
        return probs
    out = probs.clone()
    if bool(m_on.any()):  # min-p alone: a threshold on the row's max
        m = min_ps.reshape(-1, 1).to(probs.dtype) * probs.max(dim=-1, keepdim=True).values
        out = torch.where(m_on[:, None] & (probs < m), 0.0, out)
    k_rows, p_rows = k_on.nonzero().squeeze(1), (p_on & ~k_on).nonzero().squeeze(1)
    if k_rows.numel():
        vals, cand = probs[k_rows].topk(int(top_ks[k_rows].max()), dim=-1)
        _cut(out, k_rows, vals, cand, top_ks[k_rows], top_ps, min_ps, top_k_first)
    if p_rows.numel():  # the nucleus is nearly always inside the top 1024: sort the rest only
        vals, cand = probs[p_rows].topk(min(_NUCLEUS_HEAD, vocab), dim=-1)
        inside = vals.sum(-1) > top_ps[p_rows]  # the first token outside the head is cut
        _cut(out, p_rows[inside], vals[inside], cand[inside], None, top_ps, min_ps)
        if not bool(inside.all()):
            rows = p_rows[~inside]
            vals, cand = probs[rows].sort(dim=-1, descending=True)
            _cut(out, rows, vals, cand, None, top_ps, min_ps)
    return out / out.sum(-1, keepdim=True)
