"""DFLASH greedy output == plain decoding, through the real HTTP server (one server at a time).

float32: token-identical except at a true numerical tie (top-2 logprob gap < 1e-4).
bfloat16: bf16 keeps 8 significant bits, and the verify forward (prefill-shaped, B rows) rounds its
matmuls differently from one-token decode, so logits differ by a few bf16 ulps between the two
paths. On this model the logits are O(10), where one ulp is 2^-8 * 16 = 0.0625; BF16_TIE allows
two ulps of logit difference between two candidates.
"""
import json

import pytest
import requests

from harness import assert_lossless, generate_all, launch, prompts, reference

F32_TIE = 1e-4
BF16_TIE = 0.125
MAX_NEW = 32
PROMPTS = prompts(32)
CHATS = [[{"role": "user", "content": "the water of my people"}],
         [{"role": "system", "content": "you are a man"}, {"role": "user", "content": "call it a day"},
          {"role": "assistant", "content": "one day"}, {"role": "user", "content": "what long sound"}]]

# (arch, dtype, steer strength or None, block size, extra server flags)
CHUNKED = ("--chunked-prefill-size", "64")  # prompts up to 300 tokens prefill in 64-token chunks
TP2 = ("--tp-size", "2")  # two CPU ranks: replicated drafter, vocab-parallel LM head
CONFIGS = [("llama", "float32", "mixed", 16, ()), ("llama", "float32", "mixed", 8, ()),
           ("llama", "float32", "mixed", 4, ()), ("qwen3", "float32", "mixed", 16, ()),
           ("qwen3", "float32", "mixed", 8, ()), ("qwen3", "float32", "mixed", 4, ()),
           ("llama", "float32", "mixed", 16, CHUNKED), ("qwen3", "float32", "mixed", 16, TP2),
           ("llama", "bfloat16", None, 16, ())]
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


@pytest.fixture(scope="module", params=CONFIGS,
                ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-b{c[3]}" + "".join(c[4]).replace("--", "-"))
def served(request, pair):
    from conftest import MIXED

    arch, dtype, steer, block, flags = request.param
    target, drafter = pair(arch, dtype, MIXED[arch] if steer else None)
    key = (target, dtype)
    if key not in _refs:
        with launch(target, None, dtype, name=f"plain-{arch}-{dtype}") as plain:
            _refs[key] = {"gen": reference(plain, PROMPTS, MAX_NEW),
                          "chat": [chat(plain.url, m) for m in CHATS]}
    extra = ["--speculative-num-draft-tokens", str(block), *flags]
    with launch(target, drafter, dtype, extra=extra, name=f"dflash-{arch}-{dtype}-b{block}") as srv:
        yield srv, _refs[key], request.param[:4]


@pytest.mark.server
def test_generate_concurrent_lossless(served):
    srv, ref, (arch, dtype, steer, block) = served
    outs = generate_all(srv, PROMPTS, MAX_NEW)
    assert_lossless(ref["gen"], outs, F32_TIE if dtype == "float32" else BF16_TIE)
    taus = [o["meta_info"]["spec_accept_length"] for o in outs]
    verify = [o["meta_info"]["spec_verify_ct"] for o in outs]
    mean_tau = sum(taus) / len(taus)
    print(f"{arch} {dtype} B={block}: mean tau {mean_tau:.2f}, verify steps {sum(verify)}")
    assert all(1 <= t <= block for t in taus) and all(v >= 1 for v in verify)
    if steer:  # the steered drafter is right part of the time: both long and short accepts occur
        assert 1.2 < mean_tau < block, mean_tau
        hist = [0] * block
        for o in outs:
            for k, c in enumerate(o["meta_info"]["spec_correct_drafts_histogram"]):
                hist[k] += c
        assert hist[0] > 0 and sum(hist[1:]) > 0, hist


@pytest.mark.server
def test_chat_completions_lossless(served):
    srv, ref, (_, dtype, _, _) = served
    for messages, want in zip(CHATS, ref["chat"]):
        assert chat(srv.url, messages) == want or dtype != "float32"
        assert chat(srv.url, messages, stream=True) == chat(srv.url, messages)
