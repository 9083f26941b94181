"""SIGTERM drains a DFLASH server (srt/drain.py): a streaming generation running at the signal
returns its full output, a request arriving during the drain gets 503 with Retry-After, one that
outlives SGLANG_DFLASH_DRAIN_S ends with finish reason `abort`, and the process exits 0 within the
grace period. The server also takes SGLang's --api-key (`make serve API_KEY=...`, the Kubernetes
Secret): without the key a request gets 401, with it 200, and the same through SMG in front of it
given the key (replicas.py's router command). One real server (the tiny random pair: its drafts are
rarely accepted, so a generation takes seconds), signalled once at the end of the module."""

import json
import os
import signal
import subprocess
import threading
import time

import pytest
import requests

from sglang_dflash import env
from sglang_dflash.replicas import router_cmd, served_model, wait_workers
from sglang_dflash.testing.servers import LOG_DIR, free_port, launch, stop

pytestmark = pytest.mark.server

DRAIN_S = 6
PROMPT = [5, 6, 7]
FULL = 150  # finishes well inside the grace period, even on a loaded 2-core host
BEYOND = 7000  # at the tiny pair's few hundred tokens/s this outlives the grace period
# The tiny target's 2048 positions stretched, so BEYOND outlives the grace on a fast host too.
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG_CONTEXT = {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}


@pytest.fixture(scope="module")
def server(pair):
    target, drafter = pair("llama", "float32", None)
    with launch(
        target,
        drafter,
        extra=["--context-length", "8192", "--max-total-tokens", "12000", "--api-key", KEY],
        env={env.DRAIN_S.name: str(DRAIN_S), **LONG_CONTEXT},
        name="drain",
        check_drafts=False,  # the server is gone by the end of the module
    ) as srv:
        yield srv


def body(max_new, stream=False):
    sp = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    return {"input_ids": PROMPT, "sampling_params": sp, "stream": stream}


def stream_until_done(url, max_new, first_chunk: threading.Event, out: dict):
    with requests.post(url + "/generate", json=body(max_new, stream=True), headers=AUTH, stream=True, timeout=120) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                out["last"] = json.loads(line[6:])
                out["last_at"] = time.monotonic()
                first_chunk.set()
    first_chunk.set()


def post_into(url, max_new, out: dict):
    r = requests.post(url + "/generate", json=body(max_new), headers=AUTH, timeout=120)
    out.update(status=r.status_code, json=r.json() if r.ok else r.text)


def test_api_key_is_required(server):
    assert requests.post(server.url + "/generate", json=body(4), timeout=60).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert requests.post(server.url + "/generate", json=body(4), headers=wrong, timeout=60).status_code == 401
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert requests.post(server.url + "/v1/chat/completions", json=chat, timeout=60).status_code == 401
    ok = requests.post(server.url + "/generate", json=body(4), headers=AUTH, timeout=60)
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 4
    assert requests.get(server.url + "/health", timeout=30).status_code == 200  # probes carry no secret


def test_the_gateway_requires_the_key_and_sends_it_to_the_worker(server):
    """SMG with replicas.py's --api-key: it refuses clients without the key and, holding the key the
    worker requires, registers the worker and gets answers from it."""
    port = free_port()
    with open(os.path.join(LOG_DIR, f"smg-{port}.log"), "w") as log:
        cmd = router_cmd([server.url], "127.0.0.1", port, free_port(), api_key=KEY)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_workers(url, 1, [proc], timeout=60, api_key=KEY)
        assert requests.get(url + "/workers", timeout=30).status_code == 401
        assert requests.post(url + "/generate", json=body(4), timeout=60).status_code == 401
        wrong = {"Authorization": "Bearer not-the-key"}
        assert requests.post(url + "/generate", json=body(4), headers=wrong, timeout=60).status_code == 401
        chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert requests.post(url + "/v1/chat/completions", json=chat, timeout=60).status_code == 401
        ok = requests.post(url + "/generate", json=body(4), headers=AUTH, timeout=60)
        assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 4, ok.text[:300]
        chat["model"] = served_model(url, KEY)  # SMG routes by it: "default" is no model of its
        ok = requests.post(url + "/v1/chat/completions", json=chat, headers=AUTH, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4, ok.text[:300]
    finally:
        stop(proc)


def test_sigterm_drains_then_exits_0(server):  # last: the server is gone after it
    first_chunk, streamed, beyond = threading.Event(), {}, {}
    threads = [
        threading.Thread(target=stream_until_done, args=(server.url, FULL, first_chunk, streamed)),
        threading.Thread(target=post_into, args=(server.url, BEYOND, beyond)),
    ]
    for t in threads:
        t.start()
    assert first_chunk.wait(60) and streamed.get("status") == 200, streamed
    signalled = time.monotonic()
    os.kill(server.proc.pid, signal.SIGTERM)
    while requests.get(server.url + "/health", timeout=10).status_code == 200:  # load balancers look here
        assert time.monotonic() - signalled < 10, "/health still 200 10 s after SIGTERM"
        time.sleep(0.05)

    late = requests.post(server.url + "/generate", json=body(8), headers=AUTH, timeout=30)
    assert late.status_code == 503, (late.status_code, late.text[:300])
    assert late.headers.get("Retry-After") == "1"
    assert requests.get(server.url + "/server_info", headers=AUTH, timeout=30).ok  # read-only paths stay open

    for t in threads:
        t.join(DRAIN_S + 60)
    meta = streamed["last"]["meta_info"]
    assert streamed["last_at"] > signalled, "the streamed generation ended before the signal: nothing drained"
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == FULL, meta
    assert beyond["status"] == 200, beyond
    cut = beyond["json"]["meta_info"]
    assert cut["finish_reason"]["type"] == "abort", f"expected an abort after {DRAIN_S} s: {cut['finish_reason']}"
    assert 0 < cut["completion_tokens"] < BEYOND

    # SGLang's own shutdown after the drain: schedulers released, HTTP server stopped.
    rc = server.proc.wait(timeout=DRAIN_S + 30)
    assert rc == 0, f"exit code {rc}; see {server.log_path}"
    assert time.monotonic() - signalled < DRAIN_S + 30
