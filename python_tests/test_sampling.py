"""Lossless sampling at temperature > 0: the verify + accept stages (the worker's exact code path,
verify.target_tokens + the linear_verify_accept op) reproduce the target's own distribution.

A toy target over a 32-token vocabulary: position 0 has logits L0, and the token after a block
position holding token a has logits L1[a]. The drafter proposes d1, right about half of the time.
For 20,000 independent requests we emit the first two tokens exactly as the worker does (the second
comes from the same block when d1 is accepted, else from the next block's first position) and
compare their joint distribution with the exact one, p0(a) * p1(b | a), by a chi-square test. The
test must fail for deliberately broken acceptance rules.

The exact distributions p0, p1 come from SGLang's own CPU sampler (sglang_oracle.py), never from our
verify._filter, so a filter that disagrees with SGLang's cannot cancel out; test_filter_matches_...
checks our filter against that oracle directly.
"""

import pytest
import torch
from scipy.stats import chisquare
from sglang_oracle import sglang_probs

from sglang_dflash.pipeline.accept import accept_block, stop_table
from sglang_dflash.pipeline.draft import Proposal
from sglang_dflash.pipeline.target_sampling import SamplingRows, target_tokens

V, N, B = 32, 20000, 4


def filtered_probs(logits, temp, top_p, top_k, min_p):
    """The exact target distribution, as SGLang's sampler computes it (the oracle, not our code)."""
    return sglang_probs(logits, temp, top_p, top_k, min_p)


def emit_two(rule, temp, top_p, top_k, min_p, seed=0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1234)
    L0 = torch.randn(V, generator=g) * 2
    L1 = torch.randn(V, V, generator=g) * 2
    p0 = filtered_probs(L0[None], temp, top_p, top_k, min_p)[0]
    # the drafter: half of the time a fresh draw from p0 (often right), else uniform noise
    guess = torch.multinomial(p0.expand(N, V), 1).squeeze(1)
    d1 = torch.where(torch.rand(N) < 0.5, guess, torch.randint(0, V, (N,)))
    draft = torch.stack(
        [torch.zeros(N, dtype=torch.long), d1, torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.long)], 1
    )
    logits = torch.stack([L0.expand(N, V), L1[d1], L1[0].expand(N, V), L1[0].expand(N, V)], 1).reshape(N * B, V)
    params = [torch.full((N,), x) for x in (temp, top_p)] + [torch.full((N,), top_k), torch.full((N,), min_p)]
    t = target_tokens(logits, B, SamplingRows(*params))
    res = accept_block(
        draft, t, torch.zeros(N, dtype=torch.long), torch.full((N,), 100), stop_table([set()] * N, "cpu")
    )
    commit, out = res.commit_lens, res.out_tokens
    first = out[:, 0]
    # rejected at d1: the second token comes from the next block, anchored at `first`
    nxt = target_tokens(L1[first], 1, SamplingRows(*params)).squeeze(1)
    if rule == "ours":
        second = torch.where(commit >= 2, out[:, 1], nxt)
    elif rule == "emit_draft":  # broken: trust the draft token itself
        second = torch.where(commit >= 2, out[:, 1], d1)
    elif rule == "ignore_mismatch":  # broken: keep the target sample conditioned on a wrong d1
        second = t[:, 1]
    return first, second, p0


def chi2_p(first, second, p0, temp, top_p, top_k, min_p):
    g = torch.Generator().manual_seed(1234)
    torch.randn(V, generator=g)
    L1 = torch.randn(V, V, generator=g) * 2
    p1 = filtered_probs(L1, temp, top_p, top_k, min_p)
    exact = (p0[:, None] * p1).reshape(-1) * N
    seen = torch.bincount(first * V + second, minlength=V * V).double()
    return pooled_chi2(seen, exact)


def pooled_chi2(seen, exact):
    """Goodness of fit of counts `seen` to expected counts `exact` (same cells). A count in a cell of
    zero expectation (outside the target's support) fails at once, before sparse cells are pooled
    (pooled, it would hide among them); sparse cells are pooled so every expected count is >= 5."""
    outside = seen[exact <= 0].sum().item()
    assert outside == 0, f"{outside:.0f} draws outside the target's support"
    big = exact >= 5
    obs = torch.cat([seen[big], seen[~big].sum()[None]]).numpy()
    exp = torch.cat([exact[big], exact[~big].sum()[None]]).double().numpy()
    keep = exp > 0
    return chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


CASES = [(1.0, 1.0, -1, 0.0), (0.7, 1.0, -1, 0.0), (1.5, 0.9, -1, 0.0), (1.0, 1.0, 8, 0.0), (1.0, 0.95, 12, 0.05)]


@pytest.mark.parametrize("temp,top_p,top_k,min_p", CASES)
def test_sample_and_match_is_lossless(temp, top_p, top_k, min_p):
    first, second, p0 = emit_two("ours", temp, top_p, top_k, min_p)
    p = chi2_p(first, second, p0, temp, top_p, top_k, min_p)
    print(f"T={temp} top_p={top_p} top_k={top_k} min_p={min_p}: chi-square p={p:.3f}")
    assert p > 1e-3


@pytest.mark.parametrize("rule", ["emit_draft", "ignore_mismatch"])
def test_broken_rules_are_caught(rule):
    first, second, p0 = emit_two(rule, 1.0, 1.0, -1, 0.0)
    assert chi2_p(first, second, p0, 1.0, 1.0, -1, 0.0) < 1e-6


def test_seeded_rows_are_reproducible_and_greedy_rows_exact():
    logits = torch.randn(3 * B, V)
    temps, ones = torch.tensor([1.0, 1.0, 0.0]), torch.ones(3)
    ks, mins = torch.tensor([-1, -1, 1]), torch.zeros(3)
    a = target_tokens(logits, B, SamplingRows(temps, ones, ks, mins, seeds=[7, None, None], offsets=[5, 0, 0]))
    b = target_tokens(logits, B, SamplingRows(temps, ones, ks, mins, seeds=[7, 8, None], offsets=[5, 0, 0]))
    assert torch.equal(a[0], b[0])
    assert torch.equal(a[2], logits.view(3, B, V)[2].argmax(-1))
    # the same (seed, position) draws the same token whatever block row it lands in
    c = target_tokens(
        logits[1:2].repeat(B, 1),
        1,
        SamplingRows(
            temps[:1].repeat(B), torch.ones(B), ks[:1].repeat(B), mins[:1].repeat(B), seeds=[7] * B, offsets=[6] * B
        ),
    )
    assert len(set(c.view(-1).tolist())) == 1


# ---- DFlash 2: a draft with its own distribution q (the selector's sampled path) ------------------
def selector_draft(n, temp, L0, seed=0):
    """n sampled paths through a real CandidateSelector over the toy vocabulary -> draft [n, B], cand, q."""
    from sglang_dflash.model.selector import CandidateSelector
    from sglang_dflash.model.path_walk import sample_path

    g = torch.Generator().manual_seed(99)
    sel = CandidateSelector(hidden=16, vocab=V, rank=4, top_k=8)
    with torch.no_grad():
        for prm in sel.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g) * 0.5)
    unary = torch.randn(B - 1, V, generator=g) * 2  # the drafter's logits per proposal slot ...
    unary[0] = L0 + torch.randn(V, generator=g)  # ... the first one a noisy copy of the target's
    hidden = torch.randn(B - 1, 16, generator=g)
    torch.manual_seed(seed)
    values, cand = sel.candidates(unary.expand(n, -1, -1))
    with torch.no_grad():
        edges = sel.edges(torch.zeros(n, dtype=torch.long), cand, values, hidden.expand(n, -1, -1))
    idx, q = sample_path(edges, torch.full((n,), temp), -torch.log(torch.empty(n, B - 1, 8).exponential_()))
    draft = torch.cat([torch.zeros(n, 1, dtype=torch.long), cand.gather(2, idx[..., None]).squeeze(2)], 1)
    return draft, cand, q


def emit_two_with_q(rule, temp, top_p, top_k, min_p):
    from sglang_dflash.pipeline.target_sampling import draw

    g = torch.Generator().manual_seed(1234)
    L0 = torch.randn(V, generator=g) * 2
    L1 = torch.randn(V, V, generator=g) * 2
    p0 = filtered_probs(L0[None], temp, top_p, top_k, min_p)[0]
    draft, cand, q = selector_draft(N, temp, L0)
    logits = torch.stack([L0.expand(N, V), L1[draft[:, 1]], L1[draft[:, 2]], L1[draft[:, 3]]], 1).reshape(N * B, V)
    params = [torch.full((N,), x) for x in (temp, top_p)] + [torch.full((N,), top_k), torch.full((N,), min_p)]
    t = target_tokens(logits, B, SamplingRows(*params), Proposal(draft, cand, q))
    if rule != "ours":  # deliberately broken rules, built from the same pieces
        probs = filtered_probs(logits, temp, top_p, top_k, min_p).view(N, B, V)
        fresh = draw(probs.reshape(-1, V), torch.rand(N * B)).view(N, B)
        x = draft[:, 1:]
        p_x = probs[:, :-1].gather(2, x[..., None]).squeeze(2)
        if rule == "resample_from_p":  # keep the accept test, but redraw rejects from p, not the residual
            t = torch.cat([torch.where(t[:, :-1] == x, x, fresh[:, :-1]), t[:, -1:]], 1)
        elif rule == "ignore_q":  # accept with probability p(x), as if q were a point mass
            keep = torch.rand(N, B - 1) < p_x
            t = torch.cat([torch.where(keep, x, fresh[:, :-1]), t[:, -1:]], 1)
    res = accept_block(
        draft, t, torch.zeros(N, dtype=torch.long), torch.full((N,), 100), stop_table([set()] * N, "cpu")
    )
    commit, out = res.commit_lens, res.out_tokens
    first = out[:, 0]
    nxt = target_tokens(L1[first], 1, SamplingRows(*params)).squeeze(1)
    second = torch.where(commit >= 2, out[:, 1], nxt)
    return first, second, p0, commit


@pytest.mark.parametrize("temp,top_p,top_k,min_p", CASES)
def test_rejection_sampling_with_selector_q_is_lossless(temp, top_p, top_k, min_p):
    first, second, p0, commit = emit_two_with_q("ours", temp, top_p, top_k, min_p)
    p = chi2_p(first, second, p0, temp, top_p, top_k, min_p)
    print(
        f"T={temp} top_p={top_p} top_k={top_k} min_p={min_p}: chi-square p={p:.3f}, "
        f"mean accepted length {commit.float().mean():.2f}"
    )
    assert p > 1e-3
    assert 0.2 < float((commit >= 2).float().mean()) < 0.9  # the draft is right part of the time


@pytest.mark.parametrize("rule", ["resample_from_p", "ignore_q"])
def test_broken_rejection_rules_are_caught(rule):
    first, second, p0, _ = emit_two_with_q(rule, 1.0, 1.0, -1, 0.0)
    assert chi2_p(first, second, p0, 1.0, 1.0, -1, 0.0) < 1e-6


# ---- keyed noise: one vectorised counter-based hash for every seeded row -----------------------------
def test_hash32_wraps_like_the_32_bit_reference():
    from sglang_dflash.pipeline.noise import hash32

    def ref(x):
        m = 0xFFFFFFFF
        x ^= x >> 16
        x = (x * 0x7FEB352D) & m
        x ^= x >> 15
        x = (x * 0x846CA68B) & m
        return x ^ (x >> 16)

    xs = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 0xDEADBEEF] + torch.randint(0, 2**32, (1000,)).tolist()
    assert hash32(torch.tensor(xs)).tolist() == [ref(x) for x in xs]


@pytest.mark.parametrize("keying", ["seeds", "positions"])
def test_seeded_draws_follow_the_target_distribution(keying):
    """20,000 seeded draws (distinct seeds, or one seed at distinct output positions) are distributed
    as the target's filtered distribution; a keying that ignores the varying field fails."""
    g = torch.Generator().manual_seed(4321)
    L0 = torch.randn(V, generator=g) * 2
    p0 = filtered_probs(L0[None], 1.0, 0.95, 12, 0.0)[0]
    ones = lambda x: torch.full((N,), x)  # noqa: E731
    seeds = list(range(N)) if keying == "seeds" else [12345] * N
    offsets = [7] * N if keying == "seeds" else list(range(N))
    rows = SamplingRows(ones(1.0), ones(0.95), ones(12), ones(0.0), seeds=seeds, offsets=offsets)
    tokens = target_tokens(L0.expand(N, V), 1, rows).view(-1)
    exact = p0 * N
    assert int(torch.bincount(tokens, minlength=V)[exact == 0].sum()) == 0
    keep = exact >= 5
    seen = torch.bincount(tokens, minlength=V).double()
    assert chisquare(seen[keep].numpy(), (exact[keep] * seen[keep].sum() / exact[keep].sum()).numpy()).pvalue > 1e-3
    frozen = SamplingRows(ones(1.0), ones(0.95), ones(12), ones(0.0), seeds=[12345] * N, offsets=[7] * N)
    assert len(set(target_tokens(L0.expand(N, V), 1, frozen).view(-1).tolist())) == 1  # the broken keying


def test_keyed_uniforms_are_uniform_and_independent_across_streams():
    from scipy.stats import kstest

    from sglang_dflash.pipeline.noise import ACCEPT, TARGET, uniform

    seeds, offsets = list(range(2000)), [0] * 2000
    a = uniform(2000, 4, 8, seeds, offsets, TARGET, "cpu")
    b = uniform(2000, 4, 8, seeds, offsets, ACCEPT, "cpu")
    assert kstest(a.reshape(-1).numpy(), "uniform").pvalue > 1e-3
    assert abs(torch.corrcoef(torch.stack([a.reshape(-1), b.reshape(-1)]))[0, 1].item()) < 0.02
    again = uniform(3, 4, 8, [seeds[5], None, seeds[9]], [0, 0, 0], TARGET, "cpu")
    assert torch.equal(again[0], a[5]) and torch.equal(again[2], a[9])


# ---- DFlash 1 drafts drawn from the drafter's own q (SGLANG_DFLASH_PROPOSAL=q1 / qall) ---------------
def emit_two_dflash1_q(rule, n_sampled, temp, top_p, top_k, min_p):
    from sglang_dflash.pipeline.draft import DRAFT_TOP_K, draft_sampling, sample_drafts

    g = torch.Generator().manual_seed(1234)
    L0 = torch.randn(V, generator=g) * 2
    L1 = torch.randn(V, V, generator=g) * 2
    p0 = filtered_probs(L0[None], temp, top_p, top_k, min_p)[0]
    torch.manual_seed(5)
    drafter = torch.stack([L0 + torch.randn(V) * 0.7] + [torch.randn(V) * 2 for _ in range(B - 2)])  # [B-1, V]
    params = [torch.full((N,), x) for x in (temp, top_p)] + [torch.full((N,), top_k), torch.full((N,), min_p)]
    rows = SamplingRows(*params)
    temps, noise, slots = draft_sampling(rows, None, B, "q1" if n_sampled == 1 else "qall", "cpu")
    assert slots == n_sampled and noise.shape == (N, B - 1, DRAFT_TOP_K)
    prop = sample_drafts(torch.zeros(N, B, dtype=torch.long), drafter.expand(N, -1, -1), temps, slots, noise)
    draft = prop.tokens
    logits = torch.stack([L0.expand(N, V), L1[draft[:, 1]], L1[draft[:, 2]], L1[draft[:, 3]]], 1).reshape(N * B, V)
    t = target_tokens(logits, B, rows, prop)
    if rule == "resample_from_p":  # broken: keep the accept test, redraw a rejected draft from p
        from sglang_dflash.pipeline.target_sampling import draw

        fresh = draw(p0.expand(N, V), torch.rand(N))
        t[:, 0] = torch.where(t[:, 0] == draft[:, 1], draft[:, 1], fresh)
    res = accept_block(
        draft, t, torch.zeros(N, dtype=torch.long), torch.full((N,), 100), stop_table([set()] * N, "cpu")
    )
    commit, out = res.commit_lens, res.out_tokens
    first = out[:, 0]
    nxt = target_tokens(L1[first], 1, rows).squeeze(1)
    return first, torch.where(commit >= 2, out[:, 1], nxt), p0, commit


@pytest.mark.parametrize("n_sampled", [1, B - 1])
@pytest.mark.parametrize("temp,top_p,top_k,min_p", CASES[:3])
def test_dflash1_drafts_from_q_are_lossless(n_sampled, temp, top_p, top_k, min_p):
    first, second, p0, commit = emit_two_dflash1_q("ours", n_sampled, temp, top_p, top_k, min_p)
    assert chi2_p(first, second, p0, temp, top_p, top_k, min_p) > 1e-3
    assert 0.2 < float((commit >= 2).float().mean()) < 0.95  # the first draft is often accepted


def test_dflash1_drafts_from_q_with_a_broken_redraw_are_caught():
    first, second, p0, _ = emit_two_dflash1_q("resample_from_p", 1, 1.0, 1.0, -1, 0.0)
    assert chi2_p(first, second, p0, 1.0, 1.0, -1, 0.0) < 1e-6
