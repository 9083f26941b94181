"""Stage: linear-chain acceptance. Lossless by construction for point-mass (greedy) drafts.

target_tokens[i, j] is the token the TARGET emits after block position j (argmax when greedy, a
sample from its own distribution when temperature > 0: "sample and match"). A draft is accepted
while draft[i, j + 1] == target_tokens[i, j]; the target token after the accepted prefix is the
bonus. Everything the request emits is therefore a target token.
"""
from __future__ import annotations

import torch


def accept_block(draft: torch.Tensor, target_tokens: torch.Tensor):
    """draft, target_tokens [bs, B] int64 ->
    accept_lens [bs] accepted drafts (0..B-1), commit_lens [bs] = accept + 1 (bonus included),
    bonus [bs] the target token after the accepted prefix, out_tokens [bs, B] (first commit_lens valid).
    """
    match = (draft[:, 1:] == target_tokens[:, :-1]).to(torch.int32)
    accept = match.cumprod(dim=1).sum(dim=1)
    bonus = target_tokens.gather(1, accept[:, None].to(torch.int64)).squeeze(1)
    return accept, accept + 1, bonus, target_tokens
