"""Stage (verify): frequency / presence / repetition penalties, min_new_tokens and logit_bias, exact
inside a block.

Plain decoding penalizes the logits of each step by what the request has emitted so far. Block row
j of a verify block predicts the token after [output so far, d_1 .. d_j], so its penalties count the
request's output tokens PLUS the draft tokens d_1..d_j: exactly the counts plain decoding would hold
if those drafts are accepted (and rows after the first rejection are never used). The arithmetic
mirrors SGLang's penalizers bit for bit in float32: the frequency penalty is a running float32 sum
(one add per occurrence), presence and repetition are set once a token occurred. Additive penalties
run before the scaling (repetition) one, as SGLang's default (overlap) and speculative paths do;
its non-overlap path iterates a Python set of penalizer classes, whose order varies by process, so
requests combining repetition_penalty with frequency/presence penalties are order-dependent there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

ORDER = ("frequency", "presence", "repetition")  # additive first, then scaling


@dataclass
class PenaltyRows:
    """Per-request penalty state for one verify step (bs requests)."""

    frequency: torch.Tensor  # [bs] float32
    presence: torch.Tensor  # [bs] float32
    repetition: torch.Tensor  # [bs] float32 (1 = off)
    history: list  # bs lists of output token ids so far (the block's anchor is the last one)
    min_new_tokens: Optional[torch.Tensor] = None  # [bs] int64 (0 = off)
    stop_ids: Optional[torch.Tensor] = None  # [bs, S] int64, -1 padded (tokens min_new_tokens bans)
    logit_bias: Optional[torch.Tensor] = None  # [bs, V] float32, added last
    order: tuple = ORDER  # the order penalties are applied in


def _penalize(
    logits: torch.Tensor, counts: torch.Tensor, acc_freq: torch.Tensor, rows: PenaltyRows, req: torch.Tensor
) -> torch.Tensor:
    """logits [...] float32 at tokens that occurred counts [...] times in request req [...] (all three
    broadcastable) -> penalized logits."""
    seen = counts > 0
    for name in rows.order:
        if name == "frequency":
            logits = logits - acc_freq[req, counts.clamp(max=acc_freq.shape[1] - 1)]
        elif name == "presence":
            logits = logits - torch.where(seen, rows.presence[req], 0.0)
        elif name == "repetition":
            rp = torch.where(seen, rows.repetition[req], 1.0)
            logits = torch.where(logits < 0, logits * rp, logits / rp)
    return logits


def apply_penalties(logits: torch.Tensor, draft: torch.Tensor, rows: PenaltyRows) -> torch.Tensor:
    """logits [bs*B, V] verify logits; draft [bs, B] block tokens -> penalized float32 logits [bs*B, V]."""
    bs, block = draft.shape
    vocab, dev = logits.shape[1], logits.device
    out = logits.float().view(bs, block, vocab).clone()
    hist = torch.zeros(bs, vocab, dtype=torch.int64, device=dev)
    for i, h in enumerate(rows.history):
        if len(h):
            hist[i] = torch.bincount(torch.as_tensor(h, dtype=torch.int64, device=dev), minlength=vocab)[:vocab]
    # acc_freq[i, n]: SGLang's cumulated frequency penalty after n occurrences (sequential float32 adds)
    most = int(hist.max()) + block if bs else block
    acc = [torch.zeros(bs, device=dev)]
    for _ in range(most):
        acc.append(acc[-1] + rows.frequency.float())
    acc_freq = torch.stack(acc, dim=1)  # [bs, most + 1]
    req = torch.arange(bs, device=dev)
    # every row with the output's counts ...
    out = _penalize(out, hist[:, None, :], acc_freq, rows, req[:, None, None])  # broadcast over rows
    # ... then rows j >= 1 re-penalize the draft tokens d_1..d_j with the in-block counts added
    if block > 1:
        d = draft[:, 1:].to(torch.int64)  # [bs, B-1]
        same = (d[:, :, None] == d[:, None, :]).to(torch.int64)  # [bs, k, k']
        upto = same.cumsum(dim=2)  # [bs, k, j-1]: occurrences of d_k among d_1..d_j
        j = torch.arange(1, block, device=dev)
        k = torch.arange(block - 1, device=dev)
        valid = k[None, :] < j[:, None]  # [B-1 rows, B-1 tokens]: token k is inside row j's prefix
        rr, jj, kk = torch.nonzero(valid[None].expand(bs, -1, -1), as_tuple=True)
        tok = d[rr, kk]
        counts = hist[rr, tok] + upto[rr, kk, jj]
        raw = logits.float().view(bs, block, vocab)[rr, jj + 1, tok]
        out[rr, jj + 1, tok] = _penalize(raw, counts, acc_freq, rows, rr)
    if rows.min_new_tokens is not None and rows.stop_ids is not None:
        lens = torch.tensor([len(h) for h in rows.history], device=dev)[:, None] + torch.arange(block, device=dev)
        ban = lens < rows.min_new_tokens.to(dev)[:, None]  # [bs, B]
        stop = rows.stop_ids.to(dev)
        mask = torch.zeros(bs, vocab + 1, dtype=torch.bool, device=dev)
        mask.scatter_(1, torch.where(stop < 0, vocab, stop), True)
        out = out.masked_fill(ban[:, :, None] & mask[:, None, :vocab], float("-inf"))
    if rows.logit_bias is not None:
        out = out + rows.logit_bias.to(dev).float()[:, None, :]
    return out.view(bs * block, vocab)
