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
request needs follow exactly from the plain output (testing.servers.steered_verify_steps): the served
spec_verify_ct must equal them, which a drafter that silently stopped drafting cannot fake.
"""

import json

import pytest
import requests

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

# (arch, dtype, steer strength or None, block size, extra server flags)
CHUNKED = ("--chunked-prefill-size", "64")  # prompts up to 300 tokens prefill in 64-token chunks
TP2 = ("--tp-size", "2")  # two CPU ranks: replicated drafter, vocab-parallel LM head
CONFIGS = [
    ("llama", "float32", "mixed", 16, ()),
    ("llama", "float32", "mixed", 8, ()),
    ("llama", "float32", "mixed", 4, ()),
    ("qwen3", "float32", "mixed", 16, ()),
    ("qwen3", "float32", "mixed", 8, ()),
    ("qwen3", "float32", "mixed", 4, ()),
    ("llama", "float32", "mixed", 16, CHUNKED),
    ("qwen3", "float32", "mixed", 16, TP2),
    ("llama", "bfloat16", "mixed", 16, ()),
]
_refs = {}


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
    scope="module", params=CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-b{c[3]}" + "".join(c[4]).replace("--", "-")
)
def served(request, pair):
    from sglang_dflash.testing.pairs import MIXED

    arch, dtype, steer, block, flags = request.param
    target, drafter = pair(arch, dtype, MIXED[arch] if steer else None)
    key = (target, dtype)
    if key not in _refs:
        with launch(target, None, dtype, name=f"plain-{arch}-{dtype}") as plain:
            _refs[key] = {"gen": reference(plain, PROMPTS, MAX_NEW), "chat": [chat_tokens(plain.url, m) for m in CHATS]}
    extra = ["--speculative-num-draft-tokens", str(block), *flags]
    with launch(target, drafter, dtype, extra=extra, name=f"dflash-{arch}-{dtype}-b{block}") as srv:
        yield srv, _refs[key], request.param[:4]


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
    srv, ref, (arch, dtype, steer, block) = served
    outs = generate_all(srv, PROMPTS, MAX_NEW)
    if dtype == "float32":
        assert_lossless(ref["gen"], outs, F32_TIE)
    else:
        assert_lossless(ref["gen"], outs, BF16_TIE, max_excused=len(PROMPTS) // 4)
    tau = assert_speculated(outs, min_tau=1.2)
    print(f"{arch} {dtype} B={block}: tau {tau:.2f}")
    # the steered drafter: each request's verify steps follow from its output (see module doc)
    same = [(o, r) for o, r in zip(outs, ref["gen"]) if o["output_ids"] == r["output_ids"]]
    for o, r in same:
        assert o["meta_info"]["spec_verify_ct"] == steered_verify_steps(r["output_ids"], block), r["output_ids"]
    hist = [0] * block
    for o in outs:
        for k, c in enumerate(o["meta_info"]["spec_correct_drafts_histogram"]):
            hist[k] += c
    assert hist[0] > 0 and sum(hist[1:]) > 0, hist  # both short and long accepts occur


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
