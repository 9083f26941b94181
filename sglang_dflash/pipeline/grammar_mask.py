"""Stage: structured outputs. Mask each verify row with the grammar state the target would be in.

Row j of a request's verify chain [anchor, d_1 .. d_{W-1}] predicts the token after d_j, so it is
masked with the request's grammar after the anchor (already accepted by the scheduler) and the
drafts d_1 .. d_j. The matcher walks the chain while each draft is allowed by the row before it,
then rolls back everything it accepted: the scheduler advances it along the committed tokens only.
A draft the grammar forbids has probability 0 under the masked row before it, so greedy and
sampled acceptance end there by themselves; the rows after it (never committed) stay unmasked.
The target's token at every committed row is therefore drawn from exactly the masked distribution
plain decoding uses.

Grammar objects are SGLang's (xgrammar by default), duck-typed here: accept_token, rollback,
is_terminated, allocate_vocab_mask, fill_vocab_mask, apply_vocab_mask.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch


def allowed(bitmask_row: torch.Tensor, token: int) -> bool:
    """bitmask_row [ceil(V / 32)] int32 (bit t % 32 of word t // 32 set = token t allowed)."""
    return bool((int(bitmask_row[token // 32]) >> (token % 32)) & 1)


def chain_masks(grammars: Sequence, tokens: torch.Tensor, vocab: int) -> Optional[torch.Tensor]:
    """grammars [bs] (None: unconstrained); tokens [bs, W] verify chains -> bitmask [bs * W, ceil(V/32)]
    int32 on the host (all bits set for unconstrained rows), or None when no request has a grammar."""
    owner = next((g for g in grammars if g is not None), None)
    if owner is None:
        return None
    bs, width = tokens.shape
    mask = owner.allocate_vocab_mask(vocab_size=vocab, batch_size=bs * width, device="cpu")
    mask.fill_(-1)
    chains = tokens.tolist()
    for i, g in enumerate(grammars):
        if g is None or g.is_terminated():
            continue
        row, walked = i * width, 0
        g.fill_vocab_mask(mask, row)
        for j in range(1, width):
            d = chains[i][j]
            if not (0 <= d < vocab and allowed(mask[row + j - 1], d)):
                break  # acceptance ends before d_j: later rows are never committed
            g.accept_token(d)
            walked += 1
            if g.is_terminated():
                break  # d_j finished the grammar (a stop token): nothing after it is committed
            g.fill_vocab_mask(mask, row + j)
        if walked:
            g.rollback(walked)
    return mask


def apply_masks(grammars: Sequence, logits: torch.Tensor, mask: Optional[torch.Tensor]) -> None:
    """logits [bs * W, V] in place: disallowed tokens -> -inf (through the grammar backend's own op)."""
    if mask is None:
        return
    owner = next(g for g in grammars if g is not None)
    owner.apply_vocab_mask(logits=logits, vocab_mask=mask.to(logits.device, non_blocking=True))
