"""Distillation at the served temperature (trainer --distil A --distil-temperature T).

A sampled request drafts from q_T and verifies against p_T (both the softmax of logits / T), so a
slot's acceptance under the qall rule is sum_x min(p_T(x), q_T(x)) = 1 - TV(p_T, q_T)
(sampled_walk.py): what the drafter should match is p_T, not the greedy label. The loss is
CE(p_T, q_T) = KL(p_T || q_T) + H(p_T), the same gradient as the KL.

How, without a second loss kernel: the logits are hidden @ head^T with a bias-free linear head, so
logits / T = (hidden / T) @ head^T, and head_loss's fused cross-entropy on hidden / T is the loss at
temperature T (its hard-label part too, when A < 1). The stored targets are the target's top-k
log-probabilities at T = 1 (features.py); at T they become p^(1/T) renormalized over the k kept,
which drops the mass outside the top k (more of it as T grows). No T^2 factor: AdamW normalizes
the step size, and T stays near 1 where the factor is near 1.
"""

from __future__ import annotations

import torch


def temper(hidden: torch.Tensor, soft: tuple[torch.Tensor, torch.Tensor] | None, temperature: float):
    """hidden [N, H]; soft (head rows [N, K], probabilities [N, K] at T = 1, rows summing to 1 or 0)
    -> (hidden / T [N, H], (the same rows, p^(1/T) renormalized [N, K]; zero rows stay zero)).
    Unchanged at T = 1 or without soft targets (no distillation: the hard labels stay at T = 1)."""
    if temperature <= 0:
        raise ValueError(f"--distil-temperature {temperature}: must be > 0 (1 is plain distillation)")
    if soft is None or temperature == 1.0:
        return hidden, soft
    ids, p = soft
    pt = p.clamp_min(0) ** (1.0 / temperature)
    pt = pt / pt.sum(-1, keepdim=True).clamp_min(1e-30)
    return hidden / temperature, (ids, torch.where(p.sum(-1, keepdim=True) > 0, pt, torch.zeros_like(pt)))
