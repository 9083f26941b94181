"""Forced acceptance: a target whose every output the drafter predicts gives tau == the verify width
(the block size by default, any W when pinned with SGLANG_DFLASH_WIDTH)."""

import os

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
    # cpu/cpu_threads.py: every core (fewer only while the host is busy elsewhere, cpu/contention.py)
    assert state["threads_chosen"] == len(os.sched_getaffinity(0)), state
    assert state["threads"] == state["threads_chosen"] or state["thread_changes"] > 0, state


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


def test_steer_module_controls_a_dummy_weight_target():
    """The e2e check's controlled acceptance, without a server: SGLang's dummy load draws every
    weight from U(-1e-3, 1e-3); steered in place, the target emits the drafter's token everywhere."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sglang_dflash.testing.steer import steer_module

    cfg = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    for p in model.parameters():
        torch.nn.init.uniform_(p, -1e-3, 1e-3)
    ids = torch.randint(0, 256, (4, 12))

    def greedy():
        return model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)[:, 12:]

    assert not (greedy() == STEER_TOKEN).all()  # unsteered: random weights agree with nothing
    steer_module(model, 100.0, cfg.vocab_size)
    assert (greedy() == STEER_TOKEN).all()
    tied = LlamaForCausalLM(LlamaConfig(**{**cfg.to_dict(), "tie_word_embeddings": True}))
    with pytest.raises(ValueError, match="untied"):
        steer_module(tied, 100.0, cfg.vocab_size)


@pytest.mark.server
def test_steered_dummy_load_gives_full_acceptance(pair):
    """SGLANG_DFLASH_DEBUG_STEER through the plugin's load hook: a --load-format dummy target (the
    file's steering is not loaded) accepts every draft of the steered drafter, as the GPU e2e
    check's Qwen3-8B-shaped dummy rows rely on."""
    from sglang_dflash.testing.pairs import FORCED

    target, drafter = pair("llama", "float32", FORCED)
    env = {dflash_env.WIDTH.name: "8", dflash_env.DEBUG_STEER.name: "100"}
    extra = ["--load-format", "dummy", "--speculative-num-draft-tokens", "16"]
    with launch(target, drafter, "float32", name="dflash-steer-dummy", env=env, extra=extra) as srv:
        outs = generate_all(srv, prompts(4, seed=7, max_len=48), max_new_tokens=25)
    for o in outs:
        assert o["output_ids"] == [STEER_TOKEN] * 25
        assert o["meta_info"]["spec_verify_ct"] == 3  # 1 from the prefill + 3 steps of 8
