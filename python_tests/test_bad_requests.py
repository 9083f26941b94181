"""Bad requests against a DFLASH server: each gets a clear 4xx and the server keeps serving; and a
request's verify-width cap (custom_params.dflash_max_width), exact and obeyed."""

import pytest
import requests

from sglang_dflash.testing.servers import launch

CAP = "dflash_max_width"
GOOD = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
BAD = {
    "empty_prompt": ("/generate", {"text": "", "sampling_params": {"max_new_tokens": 4}}),
    "empty_ids": ("/generate", {"input_ids": [], "sampling_params": {"max_new_tokens": 4}}),
    "too_long": ("/generate", {"input_ids": [5] * 5000, "sampling_params": {"max_new_tokens": 4}}),
    "huge_max_new": ("/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 10**9}}),
    "zero_max_new": ("/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 0}}),
    "chat_zero_max_tokens": (
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
    ),
    "negative_max_new": ("/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": -1}}),
    "negative_temperature": ("/generate", {"input_ids": [5, 6], "sampling_params": {"temperature": -0.5}}),
    "top_p_zero": ("/generate", {"input_ids": [5, 6], "sampling_params": {"top_p": 0.0}}),
    "top_p_above_one": ("/generate", {"input_ids": [5, 6], "sampling_params": {"top_p": 1.5}}),
    "wrong_type": ("/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": "many"}}),
    "unknown_sampling_field": ("/generate", {"input_ids": [5, 6], "sampling_params": {"tempreature": 1}}),
    "token_out_of_vocab": ("/generate", {"input_ids": [5, 10**7], "sampling_params": {"max_new_tokens": 4}}),
    "chat_bad_messages": ("/v1/chat/completions", {"model": "default", "messages": "hello"}),
    **{
        f"max_width_{name}": ("/generate", {"input_ids": [5, 6], "sampling_params": {"custom_params": {CAP: v}}})
        for name, v in (("zero", 0), ("negative", -2), ("string", "2"), ("bool", True), ("float", 1.5))
    },
    "chat_negative_max_tokens": (
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3},
    ),
}


@pytest.fixture(scope="module")
def server(pair):
    from sglang_dflash.testing.pairs import MIXED

    target, drafter = pair("llama", "float32", MIXED["llama"])
    # Pinned to the whole block, so a width cap is the only reason a step verifies fewer rows.
    with launch(target, drafter, "float32", name="dflash-bad-requests", env={"SGLANG_DFLASH_WIDTH": "16"}) as srv:
        yield srv


@pytest.mark.server
@pytest.mark.parametrize("case", list(BAD))
def test_bad_request_gets_4xx_and_server_keeps_serving(server, case):
    path, body = BAD[case]
    r = requests.post(server.url + path, json=body, timeout=120)
    assert 400 <= r.status_code < 500, (case, r.status_code, r.text[:300])
    assert len(r.text) > 10, "the error must say what is wrong"
    if case.startswith("max_width"):
        assert CAP in r.text and ">= 1" in r.text, r.text[:300]
    ok = requests.post(server.url + "/generate", json=GOOD, timeout=120)
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 8


@pytest.mark.server
def test_invalid_json_gets_4xx(server):
    r = requests.post(
        server.url + "/generate", data=b"{not json", headers={"Content-Type": "application/json"}, timeout=60
    )
    assert 400 <= r.status_code < 500
    assert requests.get(server.url + "/health_generate", timeout=60).status_code == 200


def width_steps(server) -> dict:
    info = requests.get(server.url + "/server_info", timeout=60).json()
    return {int(w): n for w, n in info["internal_states"][0]["dflash"]["width_steps"].items()}


@pytest.mark.server
@pytest.mark.parametrize("cap,played", [(None, 16), (1, 1), (3, 2), (40, 16)])
def test_a_width_cap_is_obeyed_and_exact(server, cap, played):
    """A capped request's steps verify the widest candidate within its cap (1, 2, 4, 8, 16), and it
    decodes the same tokens as without a cap (float32, greedy)."""
    want = requests.post(server.url + "/generate", json={**GOOD, "input_ids": [9, 3, 7]}, timeout=120).json()
    sp = {**GOOD["sampling_params"], **({"custom_params": {CAP: cap}} if cap else {})}
    before = width_steps(server)
    got = requests.post(server.url + "/generate", json={"input_ids": [9, 3, 7], "sampling_params": sp}, timeout=120)
    after = width_steps(server)
    assert got.status_code == 200 and got.json()["output_ids"] == want["output_ids"]
    ran = {w for w, n in after.items() if n > before.get(w, 0)}
    assert ran == {played}, (cap, before, after)
