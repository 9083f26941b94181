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


def sglang_orchestrator(sps, device="cpu"):
    """SGLang's own penalizers over a stand-in batch of requests with sampling params sps (the
    penalizers read only reqs, device and each request's sampling_params)."""
    from types import SimpleNamespace

    from sglang.srt.sampling import penaltylib

    reqs = [SimpleNamespace(sampling_params=sp, output_ids=[], eos_token_ids=None, tokenizer=None) for sp in sps]
    batch = type("Batch", (), {})()  # the orchestrator holds a weak reference to it
    batch.device, batch.reqs = device, reqs
    classes = {
        penaltylib.BatchedFrequencyPenalizer,
        penaltylib.BatchedMinNewTokensPenalizer,
        penaltylib.BatchedPresencePenalizer,
        penaltylib.BatchedRepetitionPenalizer,
    }
    orch = penaltylib.BatchedPenalizerOrchestrator(V, batch, classes)
    batch.sampling_info = SimpleNamespace(penalizer_orchestrator=orch)
    return batch


@pytest.mark.parametrize("reverse", [False, True])
def test_width_one_penalties_equal_sglang_penalizers_in_their_order(reverse):
    """Repetition combined with frequency/presence: the penalizers' order changes the logits, and the
    order SGLang's non-overlap decode uses is its orchestrator's dict order (from a set, so it varies
    by process): we read it from the batch (srt.step_inputs.penalty_order) and match it bit for bit."""
    from types import SimpleNamespace

    from sglang_dflash.srt.step_inputs import penalty_order, penalty_rows

    def sp(f, p, r):
        return SimpleNamespace(
            frequency_penalty=f,
            presence_penalty=p,
            repetition_penalty=r,
            min_new_tokens=0,
            logit_bias=None,
            stop_token_ids=None,
            ignore_eos=False,
        )

    g = torch.Generator().manual_seed(1)
    batch = sglang_orchestrator([sp(0.7, 0.5, 1.6), sp(1.3, 0.0, 0.8), sp(0.0, 0.9, 1.3)])
    orch = batch.sampling_info.penalizer_orchestrator
    if reverse:  # another order a process may get
        orch.penalizers = dict(reversed(list(orch.penalizers.items())))
    for _ in range(6):  # plain decoding feeds each step's output tokens to the penalizers
        ids = torch.randint(0, 8, (3,), generator=g)
        orch.cumulate_output_tokens(ids)
        for r, t in zip(batch.reqs, ids.tolist()):
            r.output_ids.append(t)
    logits = torch.randn(3, V, generator=g) * 4
    want = logits.clone()
    orch.apply(want)  # SGLang's non-overlap path
    names = {"BatchedFrequencyPenalizer": "frequency", "BatchedPresencePenalizer": "presence"}
    expected = tuple(names.get(c.__name__, "repetition") for c in orch.penalizers if "MinNew" not in c.__name__)
    rows = penalty_rows(batch, V, "cpu")
    assert rows.order == penalty_order(batch) == expected
    anchors = torch.tensor([r.output_ids[-1] for r in batch.reqs])[:, None]  # width 1: the anchor row only
    assert torch.equal(apply_penalties(logits, anchors, rows), want)
    rows.order = rows.order[::-1]
    assert not torch.equal(apply_penalties(logits, anchors, rows), want)  # the order matters on this data
