"""Bad requests against a DFLASH server: each gets a clear 4xx and the server keeps serving."""

import pytest
import requests

from sglang_dflash.testing.servers import launch

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
    "chat_negative_max_tokens": (
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3},
    ),
}


@pytest.fixture(scope="module")
def server(pair):
    from sglang_dflash.testing.pairs import MIXED

    target, drafter = pair("llama", "float32", MIXED["llama"])
    with launch(target, drafter, "float32", name="dflash-bad-requests") as srv:
        yield srv


@pytest.mark.server
@pytest.mark.parametrize("case", list(BAD))
def test_bad_request_gets_4xx_and_server_keeps_serving(server, case):
    path, body = BAD[case]
    r = requests.post(server.url + path, json=body, timeout=120)
    assert 400 <= r.status_code < 500, (case, r.status_code, r.text[:300])
    assert len(r.text) > 10, "the error must say what is wrong"
    ok = requests.post(server.url + "/generate", json=GOOD, timeout=120)
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 8


@pytest.mark.server
def test_invalid_json_gets_4xx(server):
    r = requests.post(
        server.url + "/generate", data=b"{not json", headers={"Content-Type": "application/json"}, timeout=60
    )
    assert 400 <= r.status_code < 500
    assert requests.get(server.url + "/health_generate", timeout=60).status_code == 200
