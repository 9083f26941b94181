"""Stage: linear-chain acceptance. Lossless by construction for point-mass (greedy) drafts.

target_tokens[i, j] is the token the TARGET emits after block position j (argmax when greedy, a
sample from its own distribution when temperature > 0: "sample and match"). A draft is accepted
while draft[i, j + 1] == target_tokens[i, j]; the target token after the accepted prefix is the
bonus. Everything a request emits is therefore a target token. Commits stop at the request's token
budget and just after its first stop token, so nothing past a finish is committed.
Runs as one fused op (csrc/, reference in kernels/reference.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_dflash.kernels import ops


@dataclass
class Acceptance:
    """One verify step's outcome per request (all int64)."""

    accept_lens: torch.Tensor  # [bs] drafts accepted (bonus excluded)
    bonus: torch.Tensor  # [bs] the target token after the accepted prefix: the next anchor
    commit_lens: torch.Tensor  # [bs] tokens committed, 1 .. B (cut at the budget / first stop)
    new_seq_lens: torch.Tensor  # [bs] prefix + commit_lens
    out_tokens: torch.Tensor  # [bs, B] the committed tokens, -1 past commit_lens

    def committed_rows(self) -> torch.Tensor:
        """Flat indices [sum(commit_lens)] of the committed rows of the [bs * B] verify block."""
        block = self.out_tokens.shape[1]
        cols = torch.arange(block, device=self.commit_lens.device)
        return (cols[None, :] < self.commit_lens[:, None]).reshape(-1).nonzero().squeeze(1)


def accept_block(
    draft: torch.Tensor,
    target_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    budget: torch.Tensor,
    stop_ids: torch.Tensor,
) -> Acceptance:
    """draft, target_tokens [bs, B]; prefix_lens, budget [bs]; stop_ids [bs, S] (-1 padded)."""
    i64 = torch.int64
    return Acceptance(
        *ops().linear_verify_accept(
            draft.to(i64), target_tokens.to(i64), prefix_lens.to(i64), budget.to(i64), stop_ids.to(i64)
        )
    )


def stop_table(stop_sets: list[set[int]], device) -> torch.Tensor:
    """Per-request stop token sets -> [bs, S] int64 padded with -1 (S >= 1)."""
    width = max([len(s) for s in stop_sets] + [1])
    rows = [sorted(s) + [-1] * (width - len(s)) for s in stop_sets]
    return torch.tensor(rows, dtype=torch.int64, device=device).view(len(stop_sets), width)
