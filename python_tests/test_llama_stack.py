"""The target's Llama layer stack in one loop (cpu/llama_stack.py) is bit-identical to SGLang's forward.

A DFLASH server with the stack off (SGLang's layer-boundary forward) and one with it on decode the
same prompts one at a time, at widths drawn at random every step (verify shapes 1..B): tokens and
every logprob must be equal to the bit. The worker's counters show the stack ran every decode and
verify forward (and SGLang's forward the prefills), so the test cannot pass on SGLang's forward alone.
"""

import pytest

from sglang_dflash import env as dflash_env
from sglang_dflash.testing.servers import dflash_state, launch, prompts

PROMPTS = prompts(10, seed=3, max_len=120)
MAX_NEW = 24
RANDOM = dflash_env.DEBUG_RANDOM_WIDTH.name
OPS = dflash_env.CPU_OPS.name


def decode(srv):
    """(token ids, their logprobs, top-2 logprobs) per prompt, one request at a time."""
    outs = []
    for p in PROMPTS:
        body = {
            "input_ids": p,
            "return_logprob": True,
            "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0},
        }
        r = srv.post("/generate", body)
        r.raise_for_status()
        meta = r.json()["meta_info"]
        outs.append((meta["output_token_logprobs"], meta["output_top_logprobs"]))
    return outs


@pytest.mark.server
@pytest.mark.parametrize("packed", ["0", "1"])
def test_stack_bit_identical_to_sglang_forward(pair, packed):
    """packed: both servers with the target's weights packed for oneDNN (cpu/packed_weights.py)."""
    from sglang_dflash.testing.pairs import MIXED

    dtype = "bfloat16"
    target, drafter = pair("llama", dtype, MIXED["llama"])
    extra = ["--speculative-num-draft-tokens", "8"]
    runs, states = {}, {}
    for arm, stack in (("sglang", "0"), ("stack", "auto")):
        env = {RANDOM: "5", OPS: f"stack={stack},packed={packed}"}
        with launch(target, drafter, dtype, extra=extra, env=env, name=f"stack-{arm}-{dtype}-p{packed}") as srv:
            runs[arm] = decode(srv)
            states[arm] = dflash_state(srv)["target_stack"]
    assert states["sglang"]["fused"] == 0, states
    # the target's linear weights packed when asked, none otherwise
    assert all((s["packed_weights"] > 0) == (packed == "1") for s in states.values()), states
    # Every decode / verify forward (B=8 rows at most) in the loop; prefills keep SGLang's.
    assert states["stack"]["fused"] > 0 and states["stack"]["sglang"] > 0, states
    # every verify width (1..8 here) runs each layer as one call (csrc/cpu/llama_layer_cpu.cpp)
    assert 0 < states["stack"]["layer_op"] == states["stack"]["fused"], states
    for i, (a, b) in enumerate(zip(runs["sglang"], runs["stack"])):
        assert a == b, f"prompt {i}: the stack's tokens/logprobs differ from SGLang's forward"


@pytest.mark.server
def test_stack_stays_off_under_tensor_parallelism(pair):
    """Two CPU ranks: a layer's cross-rank sums live in the boundaries the stack skips, so every
    forward must be SGLang's (and the output still the plain one's: test_lossless.py's TP config)."""
    from sglang_dflash.testing.pairs import MIXED

    target, drafter = pair("llama", "bfloat16", MIXED["llama"])
    extra = ["--speculative-num-draft-tokens", "8", "--tp-size", "2"]
    with launch(target, drafter, "bfloat16", extra=extra, env={RANDOM: "5"}, name="stack-tp2") as srv:
        for p in PROMPTS[:3]:
            srv.generate(p, 8)
        state = dflash_state(srv)["target_stack"]
    assert state["fused"] == 0 and state["sglang"] > 0, state
