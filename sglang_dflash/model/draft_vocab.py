"""A reduced draft vocabulary: the drafter scores only N of the target's V tokens (EAGLE-3's d2t).

Checkpoint convention (EAGLE-3 and reduced-vocabulary DFlash exports): config `draft_vocab_size` N
and a weight `d2t` int64 [N] of offsets, target id = i + d2t[i]. A `t2d` bool [V] beside it is
accepted and ignored (it follows from d2t). Draft logits use the target LM head's rows of those N
tokens, so the [rows, vocab] head matmul of the draft shrinks V/N times; verify stays
full-vocabulary, so the output is unchanged (a token outside the N can only be the bonus token).
"""

from __future__ import annotations

import torch

from sglang_dflash.model.config import DrafterConfigError


def ids_from_d2t(d2t: torch.Tensor) -> torch.Tensor:
    """d2t [N] offsets -> target token ids [N]."""
    return torch.arange(d2t.shape[0], device=d2t.device, dtype=torch.int64) + d2t.to(torch.int64)


def d2t_from_ids(ids: torch.Tensor) -> torch.Tensor:
    """target token ids [N] (draft index i scores ids[i]) -> d2t [N] offsets."""
    return ids.to(torch.int64) - torch.arange(ids.shape[0], dtype=torch.int64)


def check_d2t(d2t: torch.Tensor, draft_vocab_size: int, vocab_size: int, path: str) -> None:
    """A bad mapping fails at start-up naming the field, not as wrong drafts later."""
    if d2t.dim() != 1 or d2t.shape[0] != draft_vocab_size:
        raise DrafterConfigError(
            f"drafter checkpoint {path!r}: weight 'd2t' has shape {tuple(d2t.shape)}, "
            f"config draft_vocab_size={draft_vocab_size} implies ({draft_vocab_size},)"
        )
    if d2t.is_floating_point():
        raise DrafterConfigError(
            f"drafter checkpoint {path!r}: weight 'd2t' must be an integer tensor, got {d2t.dtype}"
        )
    ids = ids_from_d2t(d2t)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DrafterConfigError(
            f"drafter checkpoint {path!r}: 'd2t' maps to target ids outside [0, {vocab_size}) "
            "(target id = index + d2t[index]); re-export the mapping for this target"
        )
    if ids.unique().numel() != ids.numel():
        raise DrafterConfigError(f"drafter checkpoint {path!r}: 'd2t' maps two draft tokens to the same target id")


def most_frequent(counts: torch.Tensor, n: int) -> torch.Tensor:
    """counts [V] label frequencies -> the n most frequent token ids [n], ascending (ties: lower id)."""
    order = torch.sort(counts, descending=True, stable=True).indices[:n]
    return order.sort().values


def coverage(counts: torch.Tensor, ids: torch.Tensor) -> float:
    """Share of the counted labels that fall inside `ids` (what the cut can still predict)."""
    return float(counts[ids].sum()) / max(float(counts.sum()), 1.0)
