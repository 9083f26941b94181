"""Scale-out behind SGLang's gateway (SMG): two DFLASH workers (one thread each) behind `smg launch`,
real processes, the same command `make serve REPLICAS=2` runs (sglang_dflash/replicas.py).

- Through the router: greedy outputs token-identical to a single plain server (float32), requests
  spread over both workers (each worker drafted), streaming works, each worker's `sglang:dflash_*`
  series carry its own `worker` label.
- Cache-aware routing keeps a shared-prefix conversation on one worker: its prefix-cache hit rate
  through the router is at least that of one server.
- Fault: one worker SIGKILLed in the middle of a 200-request load at concurrency 8: every request
  completes with the plain server's tokens or fails with an error the client sees (never a wrong or
  truncated output), later requests all succeed on the survivor (at concurrency 24, its queue past
  SMG's overload threshold), and a restarted worker rejoins and takes traffic again.
"""

import concurrent.futures as cf
import os
import signal
import subprocess
import threading
import time

import pytest
import requests

from sglang_dflash.replicas import router_cmd, wait_workers, worker_env
from sglang_dflash.testing.servers import LOG_DIR, Server, dflash_state, free_port, generate_all, launch, prompts, stop

pytestmark = pytest.mark.slow  # the slow tier: `make test-slow`, run by CI after `make test`

PROMPTS = prompts(16, seed=31, max_len=80)
PREFIX = prompts(4, seed=32, max_len=300)[3]  # 300 tokens shared by a conversation
NEW = 24


def worker(target, drafter, i, port=None):
    # 4 running at most: at concurrency 24 the survivor of a kill queues past SMG's overload threshold
    # (8 waiting requests), which with a dead worker beside it made SMG answer 503 to everything
    labels = [
        "--enable-metrics",
        "--extra-metric-labels",
        '{"worker": "replica-%d"}' % i,
        "--max-running-requests",
        "4",
    ]
    return launch(target, drafter, "float32", extra=labels, name=f"dflash-replica-{i}", port=port, env=worker_env(i, 2))


def router(urls, port):
    os.makedirs(LOG_DIR, exist_ok=True)
    log = open(os.path.join(LOG_DIR, f"smg-{port}.log"), "w")
    cmd = router_cmd(urls, "127.0.0.1", port, free_port())
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_workers(f"http://127.0.0.1:{port}", len(urls), [proc], timeout=60)
    return proc


def gateway(url):  # the gateway as a harness Server (its generate / post helpers), with no process of its own
    return Server(None, url, None)


def hit_rate(srv):
    """Prefix-cache hit rate of a conversation sharing PREFIX, sent one turn at a time."""
    cached = total = 0
    for i in range(8):
        out = srv.generate(PREFIX + PROMPTS[i][:8], 4)
        cached += out["meta_info"].get("cached_tokens", 0)
        total += out["meta_info"]["prompt_tokens"]
    return cached / total


def load(front, n=200, workers=8):
    """(completed outputs by prompt index, errors) of n requests at concurrency `workers`."""
    done, errors, lock = [], [], threading.Lock()

    def one(k):
        i = k % len(PROMPTS)
        try:
            out = front.generate(PROMPTS[i], NEW, timeout=120)
            with lock:
                done.append((i, out["output_ids"], out["meta_info"]["finish_reason"]))
        except Exception as e:  # noqa: BLE001 - a failed request is counted, the client may retry it
            with lock:
                errors.append(repr(e)[:200])

    with cf.ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, range(n)))
    return done, errors


@pytest.fixture(scope="module")
def pair_models(pair):
    from sglang_dflash.testing.pairs import MIXED

    target, drafter = pair("llama", "float32", MIXED["llama"])
    with launch(target, None, "float32", name="plain-scale-out") as plain:
        refs = [o["output_ids"] for o in generate_all(plain, PROMPTS, NEW)]
        single_hit = hit_rate(plain)
    return target, drafter, refs, single_hit


@pytest.fixture(scope="module")
def replicas(pair_models):
    """Two workers behind one router, shared by the routing test and then the fault test (which
    kills worker 1 and restarts it on the same port)."""
    target, drafter, _, _ = pair_models
    port, p1 = free_port(), free_port()
    with worker(target, drafter, 0) as w0:
        w1_ctx = worker(target, drafter, 1, port=p1)
        w1 = w1_ctx.__enter__()
        proc = router([w0.url, w1.url], port)
        try:
            yield w0, w1, p1, gateway(f"http://127.0.0.1:{port}")
        finally:
            stop(proc)
            try:
                w1_ctx.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - the fault test killed it on purpose
                pass


@pytest.mark.server
def test_router_serves_losslessly_across_both_workers(pair_models, replicas):
    _, _, refs, single_hit = pair_models
    w0, w1, _, front = replicas
    outs = generate_all(front, PROMPTS, NEW, workers=8)
    body = {"input_ids": PROMPTS[0], "stream": True, "sampling_params": {"max_new_tokens": NEW, "temperature": 0}}
    with requests.post(front.url + "/generate", json=body, stream=True, timeout=120) as r:
        chunks = [ln for ln in r.iter_lines() if ln.startswith(b"data:") and b"[DONE]" not in ln]
    routed_hit = hit_rate(front)
    states = [dflash_state(w0), dflash_state(w1)]
    metrics = [requests.get(w.url + "/metrics", timeout=30).text for w in (w0, w1)]
    assert [o["output_ids"] for o in outs] == refs
    assert len(chunks) > 1, "streaming through the router sent one chunk"
    assert all(s["draft_steps"] > 0 for s in states), f"a worker got no requests: {states}"
    assert all(s["threads"] == max(1, (os.cpu_count() or 1) // 2) for s in states), states  # its share
    for i, text in enumerate(metrics):
        rows = [ln for ln in text.splitlines() if ln.startswith("sglang:dflash_drafts")]
        assert rows and all(f'worker="replica-{i}"' in ln for ln in rows), rows[:2]
    print(f"prefix-cache hit rate: one server {single_hit:.3f}, through the router {routed_hit:.3f}")
    assert routed_hit >= single_hit - 1e-9


@pytest.mark.server
def test_a_worker_killed_under_load_loses_no_token(pair_models, replicas):
    target, drafter, refs, _ = pair_models
    _, w1, p1, front = replicas
    in_flight = []

    def held() -> int:
        loads = requests.get(w1.url + "/v1/loads", params={"include": "core"}, timeout=10).json()["loads"]
        return sum(r["num_running_reqs"] + r["num_waiting_reqs"] for r in loads)

    def kill():  # the moment the router has sent it requests it still holds (by 30 s at the latest)
        deadline, n = time.time() + 30, 0
        while time.time() < deadline and (n := held()) == 0:
            time.sleep(0.1)
        in_flight.append(n)
        os.killpg(os.getpgid(w1.proc.pid), signal.SIGKILL)

    killer = threading.Timer(2.0, kill)
    killer.start()
    done, errors = load(front)
    killer.join()
    wrong = [(i, ids) for i, ids, _ in done if ids != refs[i]]
    time.sleep(6)  # health checks mark the dead worker
    after, after_errors, until = [], [], time.time() + 25  # the survivor alone, queued past 8 for
    while time.time() < until:  # longer than SMG's 10-s load poll, so the gateway sees the queue
        d, e = load(front, n=48, workers=24)
        after, after_errors = after + d, after_errors + e
    with worker(target, drafter, 1, port=p1) as again:  # the same URL: the router's worker comes back
        deadline, rejoined = time.time() + 120, False
        while not rejoined and time.time() < deadline:
            load(front, n=16)
            rejoined = dflash_state(again)["draft_steps"] > 0
    print(f"fault: {in_flight} in flight at the kill, {len(done)} completed, {len(errors)} failed with an error")
    print(f"{len(wrong)} wrong; errors {errors[:3]}")
    assert in_flight and in_flight[0] > 0, f"the killed worker held no request when it died: {in_flight}"
    assert not wrong, f"silently wrong or truncated outputs: {wrong[:3]}"
    assert len(done) + len(errors) == 200 and len(done) >= 150
    assert not after_errors and all(ids == refs[i] for i, ids, _ in after), after_errors[:3]
    assert rejoined, "the restarted worker took no traffic"


@pytest.mark.server
def test_dp_size_2_in_one_server_is_lossless_and_both_ranks_draft(pair_models):
    """SGLang's data-parallel controller (--dp-size 2) with our worker in each rank."""
    target, drafter, refs, _ = pair_models
    with launch(target, drafter, "float32", extra=["--dp-size", "2", "--enable-metrics"], name="dflash-dp2") as srv:
        outs = generate_all(srv, PROMPTS, NEW, workers=8)
        states = requests.get(srv.url + "/server_info", timeout=30).json()["internal_states"]
        metrics = requests.get(srv.url + "/metrics", timeout=30).text
    assert [o["output_ids"] for o in outs] == refs
    ranks = [s["dflash"] for s in states]
    assert len(ranks) == 2 and all(r["draft_steps"] > 0 for r in ranks), ranks
    assert all(r["threads"] == max(1, (os.cpu_count() or 1) // 2) for r in ranks), ranks  # its share
    drafts = [ln for ln in metrics.splitlines() if ln.startswith("sglang:dflash_drafts_total")]
    assert {ln.split('dp_rank="')[1].split('"')[0] for ln in drafts} == {"0", "1"}, drafts
