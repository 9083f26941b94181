"""Served edges of the stop rules and of start-up, against plain decoding (float32, real servers).

- min_new_tokens on a model whose generation_config lists two end-of-sequence ids, one of them the
  token the steered drafter keeps proposing (so banned drafts sit inside accepted blocks): the same
  tokens and finish reasons as plain decoding, with and without min_new_tokens, greedy and seeded.
- The start-up cost profile runs dummy steps through the worker: with it on and off, greedy outputs
  equal plain decoding and seeded outputs equal each other (the dummy steps leave no state behind).
- Logprobs beyond greedy: unseeded sampled requests (temperature 0.7, with top-k) and a seeded one
  draw their own tokens, so the plain server is asked for its logprob of each DFLASH token at the
  same position (the prompt extended by the tokens before it); greedy requests with penalties are
  compared position by position.
"""

import concurrent.futures as cf
import json
import os
import shutil

import pytest

from sglang_dflash.folder_cache import build_once
from sglang_dflash.testing.servers import generate_all, launch, prompts

PROMPTS = prompts(8, seed=23, max_len=60)
STEER = 42  # the steered drafter's token, made the model's second end-of-sequence id
SEEDED = {"temperature": 1.0, "sampling_seed": 5}
# greedy, greedy with min_new_tokens, seeded with min_new_tokens, seeded without (shows the ban matters)
CASES = [{}, {"min_new_tokens": 12}, {"min_new_tokens": 20, **SEEDED}, SEEDED]
LOGPROBS = {"return_logprob": True, "top_logprobs_num": 3}
SAMPLED = [
    {"temperature": 0.7, "ignore_eos": True},
    {"temperature": 0.7, "top_k": 20, "ignore_eos": True},
    {"temperature": 0.7, "top_p": 0.9, "sampling_seed": 9, "ignore_eos": True},
]
PENALIZED = {
    "temperature": 0,
    "ignore_eos": True,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.3,
}  # additive: order-free


def two_eos_copy(target: str, root: str) -> str:
    def build(tmp):
        out = os.path.join(tmp, "target")
        shutil.copytree(target, out)
        path = os.path.join(out, "generation_config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["eos_token_id"] = [cfg["eos_token_id"], STEER]
        with open(path, "w") as f:
            json.dump(cfg, f)

    return os.path.join(
        build_once(os.path.join(root, "two-eos-" + os.path.basename(os.path.dirname(target))), build), "target"
    )


def run(srv):
    outs = {}
    for i, case in enumerate(CASES):
        outs[i] = generate_all(srv, PROMPTS, 24, **case)
    return {i: [(o["output_ids"], o["meta_info"]["finish_reason"]) for o in v] for i, v in outs.items()}


def with_logprobs(srv, prompt, n, params):
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, **params}, **LOGPROBS}
    return srv.post("/generate", body).json()


def sampled_logprobs(srv):
    """DFLASH outputs of each SAMPLED setting (and a greedy penalized run) with their logprobs."""
    jobs = [(p, sp) for sp in SAMPLED for p in PROMPTS[:3]] + [(p, PENALIZED) for p in PROMPTS[:3]]
    with cf.ThreadPoolExecutor(len(jobs)) as ex:
        return jobs, list(ex.map(lambda j: with_logprobs(srv, j[0], 8, j[1]), jobs))


def plain_logprob(plain, prompt, out, j, params):
    """The plain server's (logprob of out[j], top-3) at output position j, given out[:j]."""
    sp = {k: v for k, v in params.items() if k != "sampling_seed"}
    body = {
        "input_ids": prompt + out[:j],
        "sampling_params": {"max_new_tokens": 1, **sp},
        "token_ids_logprob": [out[j]],
        **LOGPROBS,
    }
    m = plain.post("/generate", body).json()["meta_info"]
    return m["output_token_ids_logprobs"][0][0][0], m["output_top_logprobs"][0]


@pytest.fixture(scope="module")
def served(pair):
    from sglang_dflash.testing.pairs import MIXED, ROOT

    target, drafter = pair("llama", "float32", MIXED["llama"])
    model = two_eos_copy(target, ROOT)
    with launch(model, drafter, "float32", name="dflash-two-eos") as srv:
        got = run(srv)
        jobs, sampled = sampled_logprobs(srv)
    with launch(model, drafter, "float32", name="dflash-no-profile", env={"SGLANG_DFLASH_PROFILE": "0"}) as srv:
        unprofiled = run(srv)
    # Penalties: SGLang's overlap scheduler feeds each output token to the penalizers one step late,
    # its non-overlap path does not (nor does DFLASH, which runs without overlap): compare with that.
    with launch(model, None, "float32", name="plain-two-eos", extra=["--disable-overlap-schedule"]) as plain:
        want = run(plain)
        logprobs = []
        for (p, sp), o in zip(jobs, sampled):
            if sp is PENALIZED:  # greedy: the same tokens, compared position by position
                w = with_logprobs(plain, p, 8, sp)["meta_info"]
                logprobs.append(
                    [
                        (a[0], b[0], a[1], b[1])
                        for a, b in zip(w["output_token_logprobs"], o["meta_info"]["output_token_logprobs"])
                    ]
                )
                continue
            ids = o["output_ids"]
            mine = o["meta_info"]["output_token_logprobs"]
            logprobs.append([(plain_logprob(plain, p, ids, j, sp)[0], mine[j][0]) for j in range(len(ids))])
    return want, got, unprofiled, (jobs, logprobs)


@pytest.mark.server
def test_min_new_tokens_with_two_eos_ids_equals_plain(served):
    want, got, _, _ = served
    for i in (0, 1):  # greedy
        assert got[i] == want[i], CASES[i]
    stopped = [f for _, f in want[0] if f["type"] == "stop" and f.get("matched") == STEER]
    assert stopped, "no greedy output ended on the second eos id: the case is not exercised"
    banned = [ids for ids, _ in want[1]]
    assert all(STEER not in ids[:12] for ids in banned), "min_new_tokens did not ban the second eos id"


@pytest.mark.server
def test_seeded_min_new_tokens_bans_both_eos_ids_on_both_servers(served):
    """A sampled request draws its own tokens (seeded DFLASH and plain outputs may differ), so the ban
    is checked on each server's outputs: no end before min_new_tokens, neither eos id inside it."""
    want, got, unprofiled, _ = served
    early = [f for ids, f in want[3] if f["type"] == "stop" and len(ids) < 20]
    assert early, "no seeded output ends before 20 tokens without min_new_tokens: the ban is not exercised"
    eos = {STEER} | {f["matched"] for _, f in want[0] + want[3] if f["type"] == "stop"}
    for name, outs in (("plain", want[2]), ("dflash", got[2]), ("dflash, no profile", unprofiled[2])):
        short = [(ids, f) for ids, f in outs if len(ids) < 20]
        assert not short, f"{name}: seeded outputs ended inside min_new_tokens: {short[:2]}"
        banned = [ids for ids, _ in outs if eos & set(ids[:20])]
        assert not banned, f"{name}: an eos id inside min_new_tokens: {banned[:2]}"


@pytest.mark.server
def test_outputs_do_not_depend_on_the_startup_profile(served):
    want, got, unprofiled, _ = served
    for i in (0, 1):
        assert unprofiled[i] == want[i], CASES[i]
    assert unprofiled[2] == got[2], "seeded outputs differ with the start-up profile off"


def logprob_rows(served, penalized: bool):
    jobs, logprobs = served[3]
    rows = [(sp, r) for (_, sp), r in zip(jobs, logprobs) if (sp is PENALIZED) == penalized]
    assert rows and all(len(r) == 8 for _, r in rows), [len(r) for _, r in rows]
    return rows


@pytest.mark.server
def test_logprobs_of_sampled_and_seeded_requests_equal_plain(served):
    for sp, rows in logprob_rows(served, penalized=False):
        for j, (want, got) in enumerate(rows):
            assert abs(want - got) < 1e-4, (sp, j, want, got)


@pytest.mark.server
def test_penalized_requests_batched_with_sampled_ones_equal_plain(served):
    """Greedy requests with frequency + presence penalties, sent together with sampled ones: the same
    tokens and logprobs as plain decoding (without overlap: see the fixture)."""
    for sp, rows in logprob_rows(served, penalized=True):
        assert [r[2] for r in rows] == [r[3] for r in rows], sp
        for j, (want, got, _, _) in enumerate(rows):
            assert abs(want - got) < 1e-4, (sp, j, want, got)
