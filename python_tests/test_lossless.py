"""DFLASH greedy output == plain decoding, through the real HTTP server (one server at a time).

float32: token-identical except at a true numerical tie (top-2 logprob gap < 1e-4).
bfloat16: bf16 keeps 8 significant bits, and the verify forward (prefill-shaped, B rows) rounds its
matmuls differently from one-token decode, so logits differ by a few bf16 ulps between the two
paths. The steered target's logits reach 16..32, where one bf16 ulp is 2^-8 * 32 = 0.125 (logprob
gaps here come in multiples of 0.0625); BF16_TIE allows two ulps between two candidates, and since
one-ulp ties are common on this model, up to a quarter of the prompts may be excused.
Either way, at a first difference DFLASH must have emitted the plain run's runner-up, and only a
few prompts may be excused (testing.servers.assert_lossless).

Every config uses the steered drafter (it always proposes token 42), so the verify steps each
request needs at a pinned width W follow exactly from the plain output
(testing.servers.steered_verify_steps): the served spec_verify_ct must equal them, which a drafter
that silently stopped drafting cannot fake. Width modes: `random` draws the verify width at random
every step (SGLANG_DFLASH_DEBUG_RANDOM_WIDTH), `adaptive` is the default controller, `fixed` pins
W = block; under the first two the count is bounded by the pinned-width counts at B and at 1.
"""

import concurrent.futures as cf
import json

import pytest
import requests

from sglang_dflash import env as dflash_env
from sglang_dflash.testing.servers import (
    assert_lossless,
    assert_speculated,
    generate_all,
    launch,
    prompts,
    reference,
    steered_verify_steps,
)

F32_TIE = 1e-4
BF16_TIE = 0.25
MAX_NEW = 32
PROMPTS = prompts(32)
CHATS = [
    [{"role": "user", "content": "the water of my people"}],
    [
        {"role": "system", "content": "you are a man"},
        {"role": "user", "content": "call it a day"},
        {"role": "assistant", "content": "one day"},
        {"role": "user", "content": "what long sound"},
    ],
]

# (arch, dtype, steer strength or None, block size, extra server flags, width mode[, draft vocab N])
CHUNKED = ("--chunked-prefill-size", "64")  # prompts up to 300 tokens prefill in 64-token chunks
TP2 = ("--tp-size", "2")  # two CPU ranks: replicated drafter, vocab-parallel LM head
CONFIGS = [  # blocks 16 and 4 bound the block sizes; 8 added nothing that those two miss
    ("llama", "float32", "mixed", 16, (), "random"),
    ("llama", "float32", "mixed", 4, (), "random"),
    ("qwen3", "float32", "mixed", 16, (), "random"),
    ("qwen3", "float32", "mixed", 4, (), "random"),
    ("llama", "float32", "mixed", 16, CHUNKED, "adaptive"),
    ("llama", "float32", "mixed", 16, (), "random", 96),  # a reduced draft vocabulary (d2t)
    ("qwen3", "float32", "mixed", 16, TP2, "fixed"),
    ("llama", "bfloat16", "mixed", 16, (), "fixed"),
]
_refs = {}
RANDOM, FIXED = dflash_env.DEBUG_RANDOM_WIDTH.name, dflash_env.WIDTH.name


def chat(url, messages, stream=False):
    body = {"model": "default", "messages": messages, "max_tokens": 24, "temperature": 0, "stream": stream}
    r = requests.post(url + "/v1/chat/completions", json=body, stream=stream, timeout=600)
    r.raise_for_status()
    if not stream:
        return r.json()["choices"][0]["message"]["content"]
    text = ""
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            for ch in json.loads(line[6:])["choices"]:
                text += ch["delta"].get("content") or ""
    return text


@pytest.fixture(
    scope="module",
    params=CONFIGS,
    ids=lambda c: (
        f"{c[0]}-{c[1]}-{c[2]}-b{c[3]}-{c[5]}" + "".join(c[4]).replace("--", "-") + "".join(f"-dv{n}" for n in c[6:])
    ),
)
def served(request, pair):
    from sglang_dflash.testing.pairs import MIXED

    arch, dtype, steer, block, flags, mode, *vocab = request.param
    target, drafter = pair(arch, dtype, MIXED[arch] if steer else None, draft_vocab=(vocab or [0])[0])
    key = (target, dtype)
    if key not in _refs:
        with launch(target, None, dtype, name=f"plain-{arch}-{dtype}") as plain:
            _refs[key] = {"gen": reference(plain, PROMPTS, MAX_NEW), "chat": [chat_tokens(plain.url, m) for m in CHATS]}
    extra = ["--speculative-num-draft-tokens", str(block), *flags]
    env = {"random": {RANDOM: "7"}, "fixed": {FIXED: str(block)}, "adaptive": {}}[mode]
    with launch(target, drafter, dtype, extra=extra, env=env, name=f"dflash-{arch}-{dtype}-b{block}-{mode}") as srv:
        yield srv, _refs[key], (arch, dtype, mode, block)


def chat_tokens(url, messages):
    """Greedy chat completion as (tokens, runner-up tokens, top-2 gaps), from OpenAI logprobs."""
    body = {
        "model": "default",
        "messages": messages,
        "max_tokens": 24,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    content = r.json()["choices"][0]["logprobs"]["content"]
    return (
        [c["token"] for c in content],
        [c["top_logprobs"][1]["token"] for c in content],
        [c["top_logprobs"][0]["logprob"] - c["top_logprobs"][1]["logprob"] for c in content],
    )


@pytest.mark.server
def test_generate_concurrent_lossless(served):
    srv, ref, (arch, dtype, mode, block) = served
    outs = generate_all(srv, PROMPTS, MAX_NEW)
    if dtype == "float32":
        assert_lossless(ref["gen"], outs, F32_TIE)
    else:
        assert_lossless(ref["gen"], outs, BF16_TIE, max_excused=len(PROMPTS) // 4)
    tau = assert_speculated(outs, min_tau=1.2)
    print(f"{arch} {dtype} B={block} {mode}: tau {tau:.2f}")
    # the steered drafter: each request's verify steps follow from its output (see module doc)
    same = [(o, r) for o, r in zip(outs, ref["gen"]) if o["output_ids"] == r["output_ids"]]
    for o, r in same:
        got, ids = o["meta_info"]["spec_verify_ct"], r["output_ids"]
        if mode == "fixed":
            assert got == steered_verify_steps(ids, block), ids
        else:
            assert steered_verify_steps(ids, block) <= got <= len(ids) - 1, (got, ids)
    hist = [0] * block
    for o in outs:
        for k, c in enumerate(o["meta_info"]["spec_correct_drafts_histogram"]):
            hist[k] += c
    assert hist[0] > 0 and sum(hist[1:]) > 0, hist  # both short and long accepts occur


@pytest.mark.server
def test_seeded_sampling_does_not_depend_on_widths(served):
    """A seeded sampled request draws the same tokens whatever widths its steps ran at (random
    mode: two runs see different width sequences; adaptive: the controller's history moves on) and,
    in float32, beside whatever batch it shares. In bfloat16 a batch's shape changes the rounding of
    every row, so there the second run is one request at a time too."""
    srv, _, (_, dtype, mode, _) = served
    sampled = [(p, {"temperature": 1.0, "top_p": 0.9, "sampling_seed": 300 + i}) for i, p in enumerate(PROMPTS[:8])]
    first = [srv.generate(p, MAX_NEW, **sp)["output_ids"] for p, sp in sampled]  # one at a time
    generate_all(srv, PROMPTS[8:16], MAX_NEW)  # other traffic moves the width sequence on
    if dtype == "float32":
        with cf.ThreadPoolExecutor(8) as ex:  # then all together, in one batch
            second = list(ex.map(lambda c: srv.generate(c[0], MAX_NEW, **c[1])["output_ids"], sampled))
    else:
        second = [srv.generate(p, MAX_NEW, **sp)["output_ids"] for p, sp in sampled]
    assert first == second


@pytest.mark.server
def test_chat_completions_lossless(served):
    srv, ref, (_, dtype, _, _) = served
    tie = F32_TIE if dtype == "float32" else BF16_TIE
    for messages, (want, runner_up, gaps) in zip(CHATS, ref["chat"]):
        got = chat_tokens(srv.url, messages)[0]
        j = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if j is None:
            assert len(got) == len(want)
        else:  # a near-tie: DFLASH took the plain run's runner-up
            assert got[j] == runner_up[j] and gaps[j] < tie, (j, got[j], want[j], runner_up[j], gaps[j])
        assert chat(srv.url, messages, stream=True) == chat(srv.url, messages)
