"""Weighted cross-entropy over a frozen LM head, fused and chunked for the CPU trainer.

The head is most of a training step: [rows, V] logits, their fp32 copy, the softmax and its
backward are memory-bound passes over tens of millions of floats. Done a chunk of rows at a time,
the logits stay in cache and the gradient wrt the hidden states is computed in the forward (the
head is frozen, so that is the only gradient), and nothing [rows, V] outlives its chunk.

Distillation (trainer --distil A) mixes the hard label with the target's own top-k distribution:
the row's target is (1 - a) onehot(label) + a p, a = A where the row has a distribution (p sums
to 1 over the head's rows), else 0; the loss is the cross-entropy to it, the gradient
softmax - target.
"""

from __future__ import annotations

import torch


class _HeadCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head, targets, weights, chunk, soft_ids, soft_p, alpha):
        # hidden [N, H] (grad); head [V, H] frozen; targets [N] in [0, V); weights [N];
        # soft_ids [N, K] in [0, V), soft_p [N, K] (rows sum to 1 or 0), or both None
        logits = torch.mm(hidden.detach().to(head.dtype), head.t())  # [N, V] in head.dtype
        loss = torch.zeros((), dtype=torch.float32)
        rows = torch.arange(chunk)
        for s in range(0, hidden.shape[0], chunk):  # in place, a cache-sized chunk of rows at a time
            r = slice(s, s + chunk)
            w, t = weights[r], targets[r]
            x = logits[r].float()  # [n, V]
            xt = x.gather(1, t[:, None])[:, 0]
            a = torch.zeros_like(w)
            if soft_ids is not None:  # gathered before the in-place softmax below
                ids, p = soft_ids[r], soft_p[r]
                a = alpha * (p.sum(-1) > 0)
                xs = (x.gather(1, ids) * p).sum(-1)  # [n] expected logit under p
            m = x.amax(-1, keepdim=True)
            z = x.sub_(m).exp_().sum(-1, keepdim=True)  # one exp per logit (logsumexp + softmax take two)
            lse = m[:, 0] + z[:, 0].log()
            nll = lse - xt
            if soft_ids is not None:
                nll = (1 - a) * nll + a * (lse - xs)
            loss += (w * nll).sum()
            x.mul_(w[:, None] / z)  # w * softmax
            x[rows[: t.shape[0]], t] -= w * (1 - a)
            if soft_ids is not None:
                x.scatter_add_(1, ids, -(w * a)[:, None] * p)
            logits[r] = x  # d loss / d logits
        grad = torch.mm(logits, head).to(hidden.dtype)  # [N, H]
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return grad * g.to(grad.dtype), None, None, None, None, None, None, None


def head_cross_entropy(
    hidden: torch.Tensor,
    head: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    chunk: int = 32,
    soft: tuple[torch.Tensor, torch.Tensor] | None = None,
    alpha: float = 0.0,
) -> torch.Tensor:
    """hidden [N, H]; head [V, H] (frozen, no grad); targets [N] ids into head's rows (-100: none);
    weights [N]; soft (ids [N, K] into head's rows, probabilities [N, K], each row summing to 1, or
    to 0 where the row has no distribution) mixed in with weight alpha ->
    sum_i weights_i * CE(hidden_i @ head^T, target_i) / sum of the counted weights.
    Equals F.cross_entropy on the bf16 logits (class probabilities when soft), weighted, normalized."""
    w = torch.where(targets >= 0, weights.float(), torch.zeros_like(weights, dtype=torch.float32))
    w = w / w.sum().clamp(min=1e-12)
    ids, p = (None, None) if soft is None or alpha == 0 else (soft[0].long(), soft[1].float())
    return _HeadCE.apply(hidden, head, targets.clamp(min=0), w, chunk, ids, p, float(alpha))


def soft_rows(
    topk_ids: torch.Tensor, topk_logp: torch.Tensor, remap: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-k (token ids [N, K], -1 for none; log-probs [N, K]) as a distribution over a
    head's rows: remap [V] token id -> head row (-100 where the head has no row for it). Tokens
    without a row drop out and the rest is renormalised (a row with none left sums to 0)."""
    valid = topk_ids >= 0
    rows = remap[topk_ids.long().clamp(min=0)]
    keep = valid & (rows >= 0)
    p = torch.where(keep, topk_logp.float().exp(), torch.zeros_like(topk_logp, dtype=torch.float32))
    p = p / p.sum(-1, keepdim=True).clamp(min=1e-12)
    return torch.where(keep, rows, torch.zeros_like(rows)), p
