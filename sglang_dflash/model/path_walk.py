"""Stage (DFlash 2): walk one path through the selector's candidate lattice, from the anchor.

Greedy requests take a point-mass draft that linear verification accepts while it matches the
target's argmax: the best path (maximum total edge score, by dynamic programming: Viterbi) for a
selector trained on whole paths, or the chain (slot by slot the best candidate after the one
chosen before: the sampled walk's T -> 0 limit) for a selector trained on each slot's conditional
softmax given a right prefix (train/dflash2.py), where it is the acceptance-optimal choice and
Viterbi is not (off-path scores are never normalized). The checkpoint says which (selector_walk).
Sampled requests draw the path slot by slot from q_j(c | a) = softmax_c(S_j(a, c) / T) (ancestral
sampling: Gumbel-max over the K candidates) and keep q for the speculative rejection rule in
verify.py, which keeps the output distribution exactly the target's.
"""

from __future__ import annotations

import torch


def best_path(edges: torch.Tensor) -> torch.Tensor:
    """edges [bs, P, K, K] (see selector.edges) -> indices [bs, P] of the max-total-score path."""
    bs, p, k, _ = edges.shape
    score = edges[:, 0, 0, :]  # [bs, K]: slot 0 hangs off the anchor (all predecessor rows equal)
    back = []
    for j in range(1, p):
        total = score[:, :, None] + edges[:, j]  # [bs, K_prev, K]
        score, arg = total.max(dim=1)
        back.append(arg)
    idx = torch.empty(bs, p, dtype=torch.int64, device=edges.device)
    idx[:, -1] = score.argmax(dim=-1)
    for j in range(p - 1, 0, -1):
        idx[:, j - 1] = back[j - 1].gather(1, idx[:, j : j + 1]).squeeze(1)
    return idx


def chain_path(edges: torch.Tensor) -> torch.Tensor:
    """edges [bs, P, K, K] -> indices [bs, P]: at each slot the best candidate after the previous pick."""
    bs, p, _, _ = edges.shape
    idx = torch.empty(bs, p, dtype=torch.int64, device=edges.device)
    prev = torch.zeros(bs, dtype=torch.int64, device=edges.device)
    rows = torch.arange(bs, device=edges.device)
    for j in range(p):
        prev = edges[rows, j, prev].argmax(dim=-1)
        idx[:, j] = prev
    return idx


def greedy_path(edges: torch.Tensor, walk: str = "best") -> torch.Tensor:
    """edges [bs, P, K, K] -> indices [bs, P] of a greedy draft: best_path or chain_path (walk)."""
    return chain_path(edges) if walk == "chain" else best_path(edges)


def sample_path(edges: torch.Tensor, temperature: torch.Tensor, gumbel: torch.Tensor):
    """edges [bs, P, K, K]; temperature [bs] (> 0); gumbel [bs, P, K] standard Gumbel noise ->
    indices [bs, P], q [bs, P, K] (q[b, j] = the distribution slot j's candidate was drawn from)."""
    bs, p, k, _ = edges.shape
    idx = torch.empty(bs, p, dtype=torch.int64, device=edges.device)
    q = torch.empty(bs, p, k, dtype=torch.float32, device=edges.device)
    prev = torch.zeros(bs, dtype=torch.int64, device=edges.device)
    rows = torch.arange(bs, device=edges.device)
    for j in range(p):
        logits = edges[rows, j, prev].float() / temperature.float()[:, None]  # [bs, K]
        q[:, j] = torch.softmax(logits, dim=-1)
        prev = (logits + gumbel[:, j]).argmax(dim=-1)
        idx[:, j] = prev
    return idx, q
