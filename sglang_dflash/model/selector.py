"""DFlash 2's candidate selector weights and edge scores (plain torch).

For each proposal slot j of a block, the target LM head over the drafter's hidden state gives the
top-k candidates c with their logits U_j(c) (after the checkpoint's output_multiplier and
final_logit_softcapping). The score of moving from token a (the previous slot's candidate, or the
anchor for slot 0) to candidate c at slot j is

    S_j(a, c) = U_j(c) + < A[a] * P(h_j), B[c] >

with rank-r predecessor/successor codebooks A, B [V, r] and P = hidden_projection [H -> r].
The path walk (path_walk.py) picks one candidate per slot from these scores. Checkpoint weights:
`candidate_selector.{hidden_projection.weight [r, H], predecessor_codebook [V, r], successor_codebook [V, r]}`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn


class CandidateSelector(nn.Module):
    def __init__(
        self,
        hidden: int,
        vocab: int,
        rank: int,
        top_k: int,
        output_multiplier: float = 1.0,
        softcap: Optional[float] = None,
        walk: str = "best",
    ):
        super().__init__()
        self.top_k, self.output_multiplier, self.softcap = top_k, output_multiplier, softcap
        self.walk = walk  # a greedy draft's path through the scores: path_walk.greedy_path
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, rank))

    def candidates(self, logits: torch.Tensor):
        """logits [..., V] target LM head over drafter hidden -> values, ids [..., K] (K = top_k)."""
        x = logits.float() * self.output_multiplier
        if self.softcap:
            x = self.softcap * torch.tanh(x / self.softcap)
        return x.topk(min(self.top_k, x.shape[-1]), dim=-1)

    def edges(
        self, anchor: torch.Tensor, cand_ids: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor:
        """anchor [bs]; cand_ids, values [bs, P, K]; hidden [bs, P, H] (the slots' drafter hidden)
        -> edge scores [bs, P, K, K]: [b, j, a, c] = S_j(candidate a of slot j-1, candidate c of slot j).
        For slot 0 every predecessor row is the anchor."""
        bs, p, k = cand_ids.shape
        prev = torch.cat([anchor.view(bs, 1, 1).expand(bs, 1, k), cand_ids[:, :-1]], dim=1)  # [bs, P, K]
        a = self.predecessor_codebook[prev].float()  # [bs, P, K, r]
        b = self.successor_codebook[cand_ids].float()  # [bs, P, K, r]
        g = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype)).float()  # [bs, P, r]
        pair = torch.einsum("bpar,bpr,bpcr->bpac", a, g, b)
        return pair + values.float()[:, :, None, :]
