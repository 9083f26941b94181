"""Choose the reduced draft vocabulary by measurement: the same trained weights, their argmax taken
over the N most frequent training labels instead of all V tokens, held-out walk tau for each N.

The cut only shrinks the draft head's matmul (verify stays full-vocabulary, output unchanged); what it
can cost is acceptance, when the target's next token is outside the N. The smallest N whose walk tau
is within `tolerance` of the full head's is kept.
"""

from __future__ import annotations

import torch

from sglang_dflash.model.draft_vocab import coverage, most_frequent
from sglang_dflash.train.blocks import walk_tau

CANDIDATES = (32768, 16384, 8192, 4096)


def label_counts(train, vocab_size: int) -> torch.Tensor:
    """[V] how often each token is a training label (the target's greedy next token)."""
    from sglang_dflash.train.trainer import _labels

    return torch.bincount(torch.cat([_labels(s) for s in train]), minlength=vocab_size)


def choose(drafter, embed, mask: int, block: int, held, counts, candidates=CANDIDATES, tolerance: float = 0.01):
    """-> (N or 0 for the full head, ids [N] or None, rows [{"draft_vocab", "coverage", "walk_tau_128"}])."""
    full = walk_tau(drafter, embed, mask, block, held, max_answer=128)
    rows = [{"draft_vocab": embed.shape[0], "coverage": 1.0, "walk_tau_128": round(full, 4)}]
    best = (0, None)
    for n in sorted(c for c in candidates if c < embed.shape[0]):
        ids = most_frequent(counts, n)
        tau = walk_tau(drafter, embed, mask, block, held, max_answer=128, vocab=ids)
        rows.append({"draft_vocab": n, "coverage": round(coverage(counts, ids), 5), "walk_tau_128": round(tau, 4)})
        if best[0] == 0 and tau >= full * (1 - tolerance):
            best = (n, ids)
    return best[0], best[1], rows
