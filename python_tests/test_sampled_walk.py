"""The sampled walk (train/sampled_walk.py): hand-computed values, the greedy walk at alphas in
{0, 1}, and Monte-Carlo through the server's own draft and verify code (pipeline/draft.py
sample_drafts, model/path_walk.py sample_path, pipeline/target_sampling.py) where p does not depend
on the drafted prefix, so the formula is exact and only sampling noise separates the two."""

import math
import random

import pytest
import torch

from sglang_dflash.model.path_walk import sample_path
from sglang_dflash.pipeline.draft import Proposal, sample_drafts
from sglang_dflash.pipeline.noise import WALK, gumbel
from sglang_dflash.pipeline.target_sampling import SamplingRows, target_tokens
from sglang_dflash.train.blocks import walk
from sglang_dflash.train.sampled_walk import (
    RULES,
    candidate_probs,
    expected_walk,
    first_max_topk,
    path_accept,
    slot_accept,
)

# one anchor, two slots, three candidates (descending drafter logit); p leaves mass off the candidates
P = torch.tensor([[[0.2, 0.6, 0.1], [0.9, 0.05, 0.0]]], dtype=torch.float64)  # [A=1, K=2, C=3]
Q = torch.tensor([[[0.5, 0.3, 0.2], [0.7, 0.2, 0.1]]], dtype=torch.float64)
BY_HAND = {  # slot 1: min sums 0.2 + 0.3 + 0.1; slot 2: 0.7 + 0.05 + 0; argmax: p at column 0
    "argmax": [0.2, 0.9],
    "q1": [0.6, 0.9],
    "qall": [0.6, 0.75],
}


@pytest.mark.parametrize("rule", RULES)
def test_slot_accept_by_hand(rule):
    got = slot_accept(P, Q.log(), 1.0, rule)[0].tolist()
    assert got == pytest.approx(BY_HAND[rule], abs=1e-12)
    # expected accepted drafts = alpha1 + alpha1 * alpha2
    a1, a2 = BY_HAND[rule]
    assert sum(slot_accept(P, Q.log(), 1.0, rule).cumprod(1)[0].tolist()) == pytest.approx(a1 + a1 * a2)


def test_slot_accept_scales_q_by_temperature():
    q_half = Q**2 / (Q**2).sum(-1, keepdim=True)  # softmax(log q / 0.5)
    want = torch.minimum(P.double(), q_half.double()).sum(-1)
    assert torch.allclose(slot_accept(P, Q.log(), 0.5, "qall"), want)
    assert torch.equal(slot_accept(P, Q.log(), 0.0, "qall"), P[..., 0])  # T = 0: the argmax draft


def test_candidate_probs_gathers_softmax_at_temperature():
    logits = torch.randn(5, 11)
    rows, cand = torch.tensor([[0, 3], [4, 1]]), torch.randint(0, 11, (2, 2, 4))
    want = torch.softmax(logits / 0.7, -1)[rows[..., None], cand]
    assert torch.allclose(candidate_probs(logits, rows, cand, 0.7), want, atol=1e-6)


def test_first_max_topk_puts_the_first_tied_maximum_first():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0], [0.0, 0.0, 0.0, 0.0, 5.0]])
    vals, idx = first_max_topk(logits, 3)
    assert idx[0].tolist() == [1, 3, 4] and vals[:, 0].tolist() == [3.0, 5.0]  # row 1: which zeros is free
    assert torch.equal(idx[:, 0], logits.argmax(-1))


def test_expected_walk_by_hand():
    # anchors 0, 1 (end 3), one slot accepted w.p. 1/2. From 1: 1 or 2 tokens, then done -> 1.5 tokens,
    # 1 step. From 0: reject (1 token, go to 1) or accept (2 tokens, done) -> 2.25 tokens, 1.5 steps.
    assert expected_walk(torch.full((2, 1), 0.5), 0, 3) == pytest.approx((2.25, 1.5))


def test_expected_walk_is_the_greedy_walk_at_point_masses():
    rng = random.Random(0)
    for _ in range(200):
        start, k = rng.randrange(0, 5), rng.randrange(1, 8)
        end = start + rng.randrange(1, 30)
        acc = [rng.randrange(0, k + 1) for _ in range(end - 1 - start)]
        alpha = (torch.arange(k)[None, :] < torch.tensor(acc, dtype=torch.long).view(-1, 1)).double()
        for w in (None, 2, 4):
            want = walk(acc, start, end, [w] if w else None)
            assert expected_walk(alpha.view(-1, k), start, end, w) == pytest.approx(want)


def test_expected_walk_matches_simulated_walks():
    g = torch.Generator().manual_seed(1)
    start, end, k = 3, 40, 5
    alpha = torch.rand(end - 1 - start, k, generator=g) ** 0.5
    tok, steps = 0, 0
    rng = random.Random(2)
    for _ in range(20000):
        p = start
        while p < end - 1:
            a = 0
            while a < k and rng.random() < float(alpha[p - start, a]):
                a += 1
            tok, steps, p = tok + min(a + 1, end - p), steps + 1, p + a + 1
    e_tok, e_steps = expected_walk(alpha, start, end)
    assert tok / steps == pytest.approx(e_tok / e_steps, rel=0.01)
    assert abs(tok / steps - e_tok / e_steps) > 1e-9  # noise exists: the check is not vacuous


def _served_accepted(rule: str, drafter_logits, target_logits, t: float, n: int, seed: int) -> torch.Tensor:
    """n requests drafting one block from drafter_logits [K, V] and verifying it against
    target_logits [K+1, V] (fixed per row: p does not depend on the drafts) through the server's
    draft and verify stages -> accepted drafts [n]."""
    torch.manual_seed(seed)
    k, v = drafter_logits.shape
    out = torch.zeros(n, k + 1, dtype=torch.long)
    logits = drafter_logits.expand(n, k, v)
    if rule == "argmax":
        out[:, 1:] = logits.argmax(-1)
        prop = Proposal(out)
    else:
        temps = torch.full((n,), t)
        noise = gumbel(n, k, v, None, None, WALK, "cpu")
        prop = sample_drafts(out, logits, temps, 1 if rule == "q1" else k, noise)
    rows = SamplingRows(temperatures=torch.full((n,), t))
    tt = target_tokens(target_logits.repeat(n, 1), k + 1, rows, prop)  # [n, K+1]
    return (prop.tokens[:, 1:] == tt[:, :-1]).long().cumprod(1).sum(1)


@pytest.mark.parametrize("t", [0.7, 1.0])
def test_formula_matches_the_server_rules_monte_carlo(t):
    g = torch.Generator().manual_seed(3)
    k, v, n = 3, 6, 40000
    drafter = torch.randn(k, v, generator=g) * 1.5
    target = drafter[torch.tensor([0, 1, 2, 2])] + torch.randn(k + 1, v, generator=g)  # close, not equal
    vals, idx = drafter.topk(v, dim=-1)  # [K, V] every token a candidate (V < DRAFT_TOP_K)
    p = torch.softmax(target[:k] / t, -1).gather(1, idx)[None]  # [1, K, V]
    means = {}
    for i, rule in enumerate(RULES):
        formula = float(slot_accept(p, vals[None], t, rule).cumprod(1).sum())
        got = _served_accepted(rule, drafter, target, t, n, seed=10 + i).double()
        tol = 4 * float(got.std()) / math.sqrt(n)
        assert float(got.mean()) == pytest.approx(formula, abs=tol), rule
        means[rule] = (formula, tol)
    # the rules differ by more than the tolerance on this p, q: a wrong rule would be caught
    assert abs(means["qall"][0] - means["argmax"][0]) > 2 * means["qall"][1]


def test_path_accept_by_hand():
    """Two slots, two candidates: slot 1 draws after the anchor, slot 2 after slot 1's accepted pick."""
    p = torch.tensor([[[0.5, 0.2], [0.3, 0.6]]], dtype=torch.float64)  # [A=1, P=2, K=2]
    q0 = torch.tensor([0.25, 0.75], dtype=torch.float64)
    q1 = torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=torch.float64)  # row a: q of slot 2 after candidate a
    edges = torch.stack([q0.log().expand(2, 2), q1.log()])[None]  # [1, P, K, K]
    kept0 = torch.minimum(p[0, 0], q0)  # [0.25, 0.2]: alpha_1 = 0.45
    after = kept0 / kept0.sum()
    alpha1 = float(sum(after[a] * torch.minimum(p[0, 1], q1[a]).sum() for a in range(2)))
    got = path_accept(p, edges, 1.0)[0].tolist()
    assert got == pytest.approx([0.45, alpha1])
    assert alpha1 == pytest.approx((0.25 * 0.4 + 0.2 * 0.8) / 0.45)


@pytest.mark.parametrize("t", [0.7, 1.0])
def test_path_formula_matches_the_server_monte_carlo(t):
    """DFlash 2's sampled path (sample_path) verified by rejection (target_tokens with q): the
    expected accepted drafts from path_accept against the server's own code."""
    g = torch.Generator().manual_seed(5)
    p_slots, k, v, n = 3, 4, 9, 40000
    edges = torch.randn(1, p_slots, k, k, generator=g) * 1.5
    edges[:, 0] = edges[:, 0, :1]  # slot 0: every predecessor row is the anchor
    cand = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(p_slots)])[None]  # [1, P, K]
    target = torch.full((p_slots + 1, v), -2.0)  # most of p on the candidates, so drafts get accepted
    target[:p_slots].scatter_(1, cand[0], torch.randn(p_slots, k, generator=g) * 1.5)
    p = torch.softmax(target[:p_slots] / t, -1).gather(1, cand[0])[None]  # [1, P, K]
    formula = float(path_accept(p, edges, t).cumprod(1).sum())
    torch.manual_seed(11)
    noise = -torch.log(torch.empty(n, p_slots, k).exponential_())
    idx, q = sample_path(edges.expand(n, -1, -1, -1), torch.full((n,), t), noise)
    out = torch.zeros(n, p_slots + 1, dtype=torch.long)
    out[:, 1:] = cand.expand(n, -1, -1).gather(2, idx[..., None]).squeeze(2)
    prop = Proposal(out, cand.expand(n, -1, -1), q, torch.ones(n, dtype=torch.bool))
    tt = target_tokens(target.repeat(n, 1), p_slots + 1, SamplingRows(temperatures=torch.full((n,), t)), prop)
    got = (prop.tokens[:, 1:] == tt[:, :-1]).long().cumprod(1).sum(1).double()
    tol = 4 * float(got.std()) / math.sqrt(n)
    assert float(got.mean()) == pytest.approx(formula, abs=tol)
    # the per-slot overlap without the carried predecessor law would differ by more than the noise
    q_anchor_row = torch.softmax(edges[:, :, 0].double() / t, -1)  # [1, P, K]: always after candidate 0
    wrong = float(torch.minimum(p, q_anchor_row).sum(-1).cumprod(1).sum())
    assert abs(wrong - formula) > 2 * tol
