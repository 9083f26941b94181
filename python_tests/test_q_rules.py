"""DFlash 1 drafts drawn from the drafter's own q (SGLANG_DFLASH_PROPOSAL q1 / qall), verified by
rejection against that q, with a vocabulary well above the top-32 truncation and a reduced draft
vocabulary mapped by a non-identity d2t. The first two emitted tokens must follow the target's own
distribution (SGLang's sampler, sglang_oracle.py); each deliberately broken rule
(testing/broken_rules.py) must fail the same chi-square test."""

import pytest
import torch
from sglang_oracle import sglang_probs
from test_sampling import pooled_chi2

from sglang_dflash.pipeline import draft
from sglang_dflash.pipeline.accept import accept_block, stop_table
from sglang_dflash.pipeline.target_sampling import SamplingRows, target_tokens
from sglang_dflash.testing.broken_rules import RULES, install

V, VD, N, B = 512, 320, 40000, 4


def emit_two(n_sampled, temp, top_p, top_k, min_p):
    g = torch.Generator().manual_seed(4321)
    L0 = torch.randn(V, generator=g) * 1.5
    L1 = torch.randn(V, V, generator=g) * 1.5
    d2t = torch.randperm(V, generator=g)[:VD]  # draft index -> target id, not the identity
    drafter = torch.stack(
        [L0[d2t] + torch.randn(VD, generator=g) * 0.5] + [torch.randn(VD, generator=g) for _ in range(B - 2)]
    )
    rows = SamplingRows(
        *[torch.full((N,), float(x)) for x in (temp, top_p)], torch.full((N,), top_k), torch.full((N,), min_p)
    )
    torch.manual_seed(11)
    temps, noise, slots = draft.draft_sampling(rows, None, B, "q1" if n_sampled == 1 else "qall", "cpu")
    prop = draft.sample_drafts(
        torch.zeros(N, B, dtype=torch.long), drafter.expand(N, -1, -1), temps, slots, noise, lambda i: d2t[i]
    )
    d = prop.tokens
    logits = torch.stack([L0.expand(N, V), L1[d[:, 1]], L1[d[:, 2]], L1[d[:, 3]]], 1).reshape(N * B, V)
    t = target_tokens(logits, B, rows, prop)
    res = accept_block(d, t, torch.zeros(N, dtype=torch.long), torch.full((N,), 100), stop_table([set()] * N, "cpu"))
    first, out, commit = res.out_tokens[:, 0], res.out_tokens, res.commit_lens
    nxt = target_tokens(L1[first], 1, rows).squeeze(1)
    second = torch.where(commit >= 2, out[:, 1], nxt)
    p0 = sglang_probs(L0[None], temp, top_p, top_k, min_p)[0]
    p1 = sglang_probs(L1, temp, top_p, top_k, min_p)
    seen = torch.bincount(first * V + second, minlength=V * V).double()
    return pooled_chi2(seen, (p0[:, None] * p1).reshape(-1) * N), float((commit >= 2).float().mean())


CASES = [(1.0, 1.0, -1, 0.0), (0.7, 1.0, 20, 0.0), (1.3, 0.9, -1, 0.02)]


@pytest.mark.parametrize("n_sampled", [1, B - 1])
@pytest.mark.parametrize("temp,top_p,top_k,min_p", CASES)
def test_drafts_from_q_over_a_reduced_vocabulary_are_lossless(n_sampled, temp, top_p, top_k, min_p):
    p, accepted = emit_two(n_sampled, temp, top_p, top_k, min_p)
    print(
        f"q slots {n_sampled}, T={temp} top_p={top_p} top_k={top_k} min_p={min_p}: p={p:.3g}, first draft accepted {accepted:.2f}"
    )
    assert p > 1e-3
    assert 0.1 < accepted < 0.95  # drafts decide many of the checked tokens


@pytest.mark.parametrize("rule", RULES)
def test_each_broken_rule_is_caught(monkeypatch, rule):
    install(rule, monkeypatch.setattr)
    p, _ = emit_two(B - 1, 0.7, 1.0, -1, 0.0)
    print(f"{rule}: p={p:.3g}")
    assert p < 1e-6, f"the broken rule {rule} passes the test: it cannot tell a broken rule"
