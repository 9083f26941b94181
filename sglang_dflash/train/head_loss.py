"""Weighted cross-entropy over a frozen LM head, fused and chunked for the CPU trainer.

The head is most of a training step: [rows, V] logits, their fp32 copy, the softmax and its
backward are memory-bound passes over tens of millions of floats. Done a chunk of rows at a time,
the logits stay in cache and the gradient wrt the hidden states is computed in the forward (the
head is frozen, so that is the only gradient), and nothing [rows, V] outlives its chunk.
"""

from __future__ import annotations

import torch


class _HeadCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head, targets, weights, chunk):
        # hidden [N, H] (grad); head [V, H] frozen; targets [N] in [0, V) or -100; weights [N]
        logits = torch.mm(hidden.detach().to(head.dtype), head.t())  # [N, V] in head.dtype
        loss = torch.zeros((), dtype=torch.float32)
        rows = torch.arange(chunk)
        for s in range(0, hidden.shape[0], chunk):  # in place, a cache-sized chunk of rows at a time
            r = slice(s, s + chunk)
            w, t = weights[r], targets[r]
            x = logits[r].float()  # [n, V]
            xt = x.gather(1, t[:, None])[:, 0]
            m = x.amax(-1, keepdim=True)
            z = x.sub_(m).exp_().sum(-1, keepdim=True)  # one exp per logit (logsumexp + softmax take two)
            loss += (w * (m[:, 0] + z[:, 0].log() - xt)).sum()
            x.mul_(w[:, None] / z)  # w * softmax
            x[rows[: t.shape[0]], t] -= w
            logits[r] = x  # d loss / d logits
        grad = torch.mm(logits, head).to(hidden.dtype)  # [N, H]
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return grad * g.to(grad.dtype), None, None, None, None


def head_cross_entropy(
    hidden: torch.Tensor, head: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, chunk: int = 32
) -> torch.Tensor:
    """hidden [N, H]; head [V, H] (frozen, no grad); targets [N] ids into head's rows (-100: none);
    weights [N] -> sum_i weights_i * CE(hidden_i @ head^T, targets_i) / sum of the counted weights.
    Equals F.cross_entropy on the bf16 logits, reduction 'none', weighted and normalized."""
    w = torch.where(targets >= 0, weights.float(), torch.zeros_like(weights, dtype=torch.float32))
    w = w / w.sum().clamp(min=1e-12)
    return _HeadCE.apply(hidden, head, targets.clamp(min=0), w, chunk)
