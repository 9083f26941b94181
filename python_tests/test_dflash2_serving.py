"""A DFlash 2 checkpoint made on the fly serves losslessly through the real server (float32):
greedy output token-identical to plain decoding (under both greedy walks through the selector's
candidates: the best path and the chain),
penalties exact, seeded sampled requests reproducible by seed (they draft the best path and are
verified by sample-and-match, so verify widths cannot move their draws) while greedy requests in the
same batches stay exact, and unseeded sampled requests (sampled paths + rejection against q) draw what
plain decoding draws: a chi-square test of homogeneity against the plain server's own draws at output
positions 1..4 (verify-step draws) plus a support check of every token plain never drew there (chi2.py,
as test_sampled_rules.py does for DFlash 1). A broken rejection rule fails it: bench/mutations.py
residual_from_p (a rejected path redrawn from p instead of the residual)."""

import concurrent.futures as cf
import os

import pytest
from chi2 import draws, homogeneity_p, outside_support

from sglang_dflash.testing.servers import assert_lossless, generate_all, launch, penalty_cases, prompts, reference

PROMPTS = prompts(16, seed=5, max_len=200)
MAX_NEW = 32
CHI_PROMPT = prompts(6, seed=3, max_len=40)[2]
CHI_N, CHI_NEW, CHI_POSITIONS = 1200, 6, (1, 2, 3, 4)
CHI_PARAMS = {"temperature": 1.0, "top_k": 24}
VOCAB = 384  # the tiny target's vocabulary
# 8 comparisons (4 positions x 2 walks). At 600 draws a side the residual_from_p mutation (bench/mutations.py)
# scored within a factor 3 of the bar on the chain walk: 1200 gives it a margin.
MIN_P = 1e-6
D2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}


def dflash2_drafter(target, walk="best"):
    from sglang_dflash.testing.pairs import ROOT
    from sglang_dflash.folder_cache import build_once
    from sglang_dflash.testing.tiny_drafter import make_tiny_drafter

    def build(tmp):
        make_tiny_drafter(tmp, target, block_size=8, steer=True, dflash2={**D2, "selector_walk": walk})

    return build_once(os.path.join(ROOT, f"dflash2-llama-f32-mixed-{walk}-v1"), build)


# The plain server stays up for both walks (asleep when idle: cpu_serving.sleep_on_idle): the support
# check asks it about the DFlash 2 servers' tokens. Each server its own --random-seed: two servers
# seeded alike draw unseeded requests from one torch stream, and the chi-square test assumes the two
# samples independent.
@pytest.fixture(scope="module")
def plain(pair):
    from sglang_dflash.testing.pairs import MIXED

    target, _ = pair("llama", "float32", MIXED["llama"])
    cases = penalty_cases(PROMPTS[:3])
    flags = ["--disable-overlap-schedule", "--random-seed", "11"]
    with launch(target, None, "float32", name="plain-dflash2", extra=flags) as srv:
        refs = reference(srv, PROMPTS, MAX_NEW)
        pen = [srv.generate(p, MAX_NEW, **c)["output_ids"] for p, c in cases]
        chi = [o["output_ids"] for o in draws(srv, CHI_PROMPT, CHI_N, CHI_NEW, CHI_PARAMS)]
        yield srv, refs, cases, pen, chi


# Both greedy walks (selector_walk: Viterbi "best", and "chain", which trained checkpoints use):
# pytest finishes one walk's server before it starts the other's.
@pytest.fixture(scope="module", params=["best", "chain"])
def served(pair, plain, request):
    from sglang_dflash.testing.pairs import MIXED

    target, _ = pair("llama", "float32", MIXED["llama"])
    drafter = dflash2_drafter(target, request.param)
    _, refs, cases, pen, _ = plain
    # Width pinned to the block: every step drafts through the selector and the convolutions (under
    # the adaptive controller a run could verify at width 1 throughout and prove nothing of DFlash 2).
    seed = ["--random-seed", str(12 + ["best", "chain"].index(request.param))]
    env = {"SGLANG_DFLASH_WIDTH": "8"}
    with launch(target, drafter, "float32", extra=seed, name=f"dflash2-{request.param}", env=env) as srv:
        yield srv, refs, cases, pen


@pytest.mark.server
def test_dflash2_greedy_is_lossless(served):
    srv, refs, *_ = served
    assert "DFlash 2" in srv.log()
    outs = generate_all(srv, PROMPTS, MAX_NEW)
    assert_lossless(refs, outs, 1e-4)
    tau = sum(o["meta_info"]["completion_tokens"] for o in outs) / sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    print(f"DFlash 2 greedy tau {tau:.2f}")
    assert tau > 1.5


@pytest.mark.server
def test_dflash2_penalties_match_plain(served):
    srv, _, cases, pen = served
    for (p, c), want in zip(cases, pen):
        assert srv.generate(p, MAX_NEW, **c)["output_ids"] == want, c


@pytest.mark.server
def test_dflash2_sampling_is_seeded_and_keeps_greedy_exact(served):
    srv, refs, *_ = served
    sampled = {"temperature": 1.0, "top_p": 0.95, "sampling_seed": 7}
    jobs = [(p, {"temperature": 0}) for p in PROMPTS[:8]] + [(p, sampled) for p in PROMPTS[:8]]
    with cf.ThreadPoolExecutor(16) as ex:
        first = list(ex.map(lambda j: srv.generate(j[0], MAX_NEW, **j[1]), jobs))
    assert_lossless(refs[:8], first[:8], 1e-4)  # greedy rows inside sampling batches
    again = [srv.generate(p, MAX_NEW, **sampled) for p in PROMPTS[:8]]  # alone, not batched
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in first[8:]]
    assert any(o["output_ids"] != r["output_ids"] for o, r in zip(first[8:], refs[:8]))
    ct = sum(o["meta_info"]["spec_verify_ct"] for o in first[8:])
    print(f"DFlash 2 seeded sampled tau {sum(len(o['output_ids']) for o in first[8:]) / ct:.2f}")
    # unseeded: sampled paths verified by rejection against q, beside greedy rows that stay exact
    jobs = [(p, {"temperature": 0}) for p in PROMPTS[:8]] + [(p, {"temperature": 1.0}) for p in PROMPTS[8:]]
    with cf.ThreadPoolExecutor(16) as ex:
        mixed = list(ex.map(lambda j: srv.generate(j[0], MAX_NEW, **j[1]), jobs))
    assert_lossless(refs[:8], mixed[:8], 1e-4)


@pytest.mark.server
def test_dflash2_unseeded_draws_match_plain_server_draws(plain, served):
    """Sampled paths verified by rejection against q draw what plain decoding draws (CHI_N unseeded
    requests each side, at the verify-step positions)."""
    psrv, *_, ref = plain
    srv = served[0]
    outs = draws(srv, CHI_PROMPT, CHI_N, CHI_NEW, CHI_PARAMS)
    got = [o["output_ids"] for o in outs]
    tau = sum(len(g) for g in got) / sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    ps = {pos: homogeneity_p([r[pos] for r in ref], [g[pos] for g in got]) for pos in CHI_POSITIONS}
    print(f"DFlash 2 rejection-sampled tau {tau:.2f}, chi-square p by position {ps}")
    assert tau > 1.1, f"drafts decide no sampled token (tau {tau:.2f}): the test proves nothing"
    outside = [b for pos in CHI_POSITIONS for b in outside_support(psrv, CHI_PROMPT, VOCAB, ref, got, pos, CHI_PARAMS)]
    assert not outside, f"tokens outside the target's support (position, token): {outside[:5]}"
    assert min(ps.values()) > MIN_P, f"DFlash 2 draws differ from plain decoding's: {ps}"
