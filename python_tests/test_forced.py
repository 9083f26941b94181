"""Forced acceptance: a target whose every output the drafter predicts gives tau == the verify width
(the block size by default, any W when pinned with SGLANG_DFLASH_WIDTH)."""

import pytest

from sglang_dflash import env as dflash_env
from sglang_dflash.testing.servers import dflash_state, generate_all, launch, prompts
from sglang_dflash.testing.tiny_drafter import STEER_TOKEN


@pytest.mark.server
@pytest.mark.parametrize("width", [16, 4])
def test_forced_acceptance_full_blocks(pair, width):
    from sglang_dflash.testing.pairs import FORCED

    block = 16
    target, drafter = pair("llama", "float32", FORCED)
    W = width
    env = {dflash_env.WIDTH.name: str(width)}
    steps = 3
    with launch(
        target,
        drafter,
        "float32",
        name=f"dflash-forced-w{W}",
        env=env,
        extra=["--speculative-num-draft-tokens", str(block)],
    ) as srv:
        # prefill emits 1 token, then every verify step commits W tokens (the last one is cut to
        # the budget); SGLang's spec_accept_length is completion_tokens / verify steps.
        outs = generate_all(srv, prompts(8, seed=5, max_len=64), max_new_tokens=steps * W)
        state = dflash_state(srv)
    for o in outs:
        assert o["output_ids"] == [STEER_TOKEN] * (steps * W)
        assert o["meta_info"]["spec_verify_ct"] == steps
        assert o["meta_info"]["spec_accept_length"] == W
        # every block was accepted whole (W - 1 drafts); the last one is cut to the budget
        hist = o["meta_info"]["spec_correct_drafts_histogram"]
        assert hist[W - 1] == steps - 1 and hist[W - 2] == 1 and sum(hist) == steps
    assert state["width_steps"] == {str(W): state["draft_steps"]}, state


@pytest.mark.server
def test_width_one_is_plain_decoding_without_a_draft(pair):
    """W = 1: one target row per request and no drafter forward at all."""
    from sglang_dflash.testing.pairs import FORCED

    target, drafter = pair("llama", "float32", FORCED)
    env = {dflash_env.WIDTH.name: "1"}
    with launch(target, drafter, "float32", name="dflash-forced-w1", env=env, check_drafts=False) as srv:
        outs = generate_all(srv, prompts(4, seed=5, max_len=64), max_new_tokens=9)
        state = dflash_state(srv)
    for o in outs:
        assert o["output_ids"] == [STEER_TOKEN] * 9
        assert o["meta_info"]["spec_verify_ct"] == 8  # the first token comes from the prefill
    assert state["draft_steps"] == 0 and state["width_steps"]["1"] > 0, state


@pytest.mark.server
def test_adaptive_width_speculates_when_it_pays(pair):
    """The default controller on the forced pair: every draft is accepted, so it widens to the
    whole block almost at once (it may start narrower while its acceptance estimate is a prior)."""
    from sglang_dflash.testing.pairs import FORCED

    target, drafter = pair("llama", "float32", FORCED)
    with launch(target, drafter, "float32", name="dflash-forced-adaptive") as srv:
        outs = generate_all(srv, prompts(8, seed=6, max_len=64), max_new_tokens=96)
        state = dflash_state(srv)
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    steps = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    assert tokens / steps > 10, (tokens / steps, state)
    assert state["width_mode"] == "adaptive" and int(max(state["width_steps"], key=int)) == 16, state
