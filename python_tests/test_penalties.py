"""In-block penalties equal plain decoding's, step by step, bit for bit (float32).

The reference replays what SGLang's own penalizers hold when plain decoding reaches block row j:
the output so far plus the drafts d_1..d_j, accumulated one token at a time (scatter_add / scatter_
as the penalizers do), applied with SGLang's own scaling function, in the given order.
"""

import pytest
import torch
from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

from sglang_dflash.pipeline.penalties import PenaltyRows, apply_penalties

V, B = 50, 6


def reference_row(logits, out_ids, i, rows):
    """Plain decoding's penalized logits [V] for request i after emitting out_ids."""
    cum_f, cum_p, cum_r = torch.zeros(1, V), torch.zeros(1, V), torch.ones(1, V)
    for t in out_ids:
        idx = torch.tensor([[t]])
        cum_f.scatter_add_(1, idx, rows.frequency[i].view(1, 1))
        cum_p.scatter_(1, idx, rows.presence[i].view(1, 1))
        cum_r.scatter_(1, idx, rows.repetition[i].view(1, 1))
    x = logits.clone()[None]
    for name in rows.order:
        if name == "frequency":
            x.sub_(cum_f)
        elif name == "presence":
            x.sub_(cum_p)
        else:
            apply_scaling_penalties(x, cum_r)
    if len(out_ids) < int(rows.min_new_tokens[i]):
        for s in rows.stop_ids[i].tolist():
            if s >= 0:
                x[0, s] += float("-inf")
    if rows.logit_bias is not None:
        x.add_(rows.logit_bias[i])
    return x[0]


@pytest.mark.parametrize("order", [("frequency", "presence", "repetition"), ("repetition", "presence", "frequency")])
def test_in_block_penalties_equal_sequential_plain_decoding(order):
    g = torch.Generator().manual_seed(0)
    bs = 4
    logits = torch.randn(bs * B, V, generator=g) * 3
    draft = torch.randint(0, 8, (bs, B), generator=g)  # few distinct tokens: repeats inside the block
    history = [torch.randint(0, 8, (n,), generator=g).tolist() for n in (1, 5, 12, 3)]
    for i in range(bs):
        draft[i, 0] = history[i][-1]  # the anchor is the last output token
    rows = PenaltyRows(
        frequency=torch.tensor([0.1, 0.7, 0.0, 1.3]),
        presence=torch.tensor([0.0, 0.5, 0.3, 1.1]),
        repetition=torch.tensor([1.0, 1.3, 1.7, 0.9]),
        history=history,
        min_new_tokens=torch.tensor([0, 7, 0, 5]),
        stop_ids=torch.tensor([[2, -1], [2, 3], [2, -1], [4, 5]]),
        logit_bias=torch.randn(bs, V, generator=g),
        order=order,
    )
    got = apply_penalties(logits, draft, rows).view(bs, B, V)
    for i in range(bs):
        for j in range(B):
            want = reference_row(logits[i * B + j], history[i] + draft[i, 1 : j + 1].tolist(), i, rows)
            assert torch.equal(got[i, j], want), (i, j, (got[i, j] - want).abs().max())


def test_no_penalty_leaves_logits_untouched():
    logits = torch.randn(2 * B, V)
    rows = PenaltyRows(torch.zeros(2), torch.zeros(2), torch.ones(2), [[1], [2, 3]])
    assert torch.equal(apply_penalties(logits, torch.randint(0, V, (2, B)), rows), logits)
