"""Step graphs served (SGLANG_DFLASH_GRAPHS=eager, the CPU twin of CUDA graphs): draft steps padded
to SGLang's capture buckets (--cuda-graph-bs-decode 1 4 8) and replayed from static buffers give
float32 outputs token-identical to plain decoding and to the same server without graphs, at batch
sizes 1, a bucket edge (4), one above it (5, padded to 8) and above the largest bucket (9, eager and
counted); seeded sampled requests keep their tokens. The pair's drafts depend on the context, so
the equal verify-step counts say the replayed draft steps attended over their own batch's plan."""

import pytest

from sglang_dflash.testing.servers import assert_lossless, dflash_state, generate_all, launch, prompts, reference

PROMPTS = prompts(9, seed=11, max_len=120)
GROUPS = (1, 4, 5, 9)  # concurrent requests per round: the batch sizes the draft steps see
MAX_NEW = 24
SEEDED = {"temperature": 1.0, "top_p": 0.9, "sampling_seed": 5}
BUCKETS = ["--cuda-graph-bs-decode", "1", "4", "8"]


def rounds(srv):
    out = {n: generate_all(srv, PROMPTS[:n], MAX_NEW) for n in GROUPS}
    seeded = generate_all(srv, PROMPTS[:4], MAX_NEW, **SEEDED)
    return out, seeded, dflash_state(srv)


@pytest.fixture(scope="module")
def runs(context_pair):
    """The context-dependent pair (testing/context_drafter.py): its drafts read the request's context
    through the block attention, so a replay attending over another plan's keys drafts differently."""
    from sglang_dflash.testing import context_drafter as cd

    target, drafter = context_pair
    with launch(target, None, "float32", name="plain-graphs", extra=["--disable-overlap-schedule"]) as plain:
        refs = reference(plain, PROMPTS, MAX_NEW)
    pinned = {"SGLANG_DFLASH_WIDTH": str(cd.BLOCK)}  # every step drafts
    block = ["--speculative-num-draft-tokens", str(cd.BLOCK)]
    env = {**pinned, "SGLANG_DFLASH_GRAPHS": "0"}
    with launch(target, drafter, "float32", name="dflash-nographs", env=env, extra=block) as s:
        off = rounds(s)
    env = {**pinned, "SGLANG_DFLASH_GRAPHS": "eager"}
    with launch(target, drafter, "float32", name="dflash-graphs", env=env, extra=BUCKETS + block) as s:
        on = rounds(s)
        log = s.log()
    return refs, off, on, log


@pytest.mark.server
def test_padded_replay_is_lossless_and_drafts_as_eager(runs):
    refs, off, on, log = runs
    assert "DFLASH step graphs: eager backend, batch-size buckets [1, 4, 8]" in log
    for n in GROUPS:
        assert_lossless(refs[:n], on[0][n], 1e-4)
        assert [o["output_ids"] for o in on[0][n]] == [o["output_ids"] for o in off[0][n]], n
    # the drafts are the eager ones: the same tokens verified in the same number of steps
    steps = lambda r: sum(o["meta_info"]["spec_verify_ct"] for n in GROUPS for o in r[0][n])  # noqa: E731
    assert steps(on) == steps(off), (steps(on), steps(off))
    tokens = sum(o["meta_info"]["completion_tokens"] for n in GROUPS for o in on[0][n])
    assert tokens / steps(on) > 1.5, tokens / steps(on)  # drafts that need the context were accepted


@pytest.mark.server
def test_seeded_requests_keep_their_tokens(runs):
    _, off, on, _ = runs
    assert [o["output_ids"] for o in on[1]] == [o["output_ids"] for o in off[1]]


@pytest.mark.server
def test_captures_replays_and_the_fallback_are_counted(runs):
    _, off, on, _ = runs
    graphs = on[2]["graphs"]
    assert graphs["captured"] >= 3 and graphs["replayed"] > graphs["captured"], graphs
    assert graphs.get("fallback:batch above the largest bucket", 0) > 0, graphs  # the 9-request round
    assert "graphs" not in off[2]
    assert on[2]["draft_failures"] == 0 and on[2]["draft_steps"] > 0, on[2]  # every step drafted
