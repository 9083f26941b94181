"""A day of traffic: two DFLASH workers behind SMG on the embedded model, one killed and restarted.

The default server (bf16, the shipped drafter, our launcher's CPU defaults), two workers with a core
each behind `smg launch` (the layout of `make serve REPLICAS=2`), --requests requests (default
10,000) at --concurrency, a seeded mix of what users send: greedy, seeded and unseeded sampled
(T 0.7 and 1.0), JSON-schema structured, streamed to the end, aborted through the API, streams the
client hangs up on, and a share of bad requests (each must get a 4xx). Prompts are chat prompts of
kinds no training run reads (bench/unseen_set.py), max_new_tokens log-uniform 1 .. 256. Worker 1
is SIGKILLed a third of the way in and restarted on its port halfway; the gateway re-admits it.

Afterwards: every request ended as completed / aborted / disconnected / refused (a 4xx to a bad
request) or error, errors split into those in flight on the killed worker and the rest (which must
be 0); both workers healthy with an empty KV pool after a cache flush; RSS and KV use sampled over
the run; draft failures summed; and every completed greedy output checked against a plain server's
greedy output of the same prompt (prefix-consistent: one plain request per prompt), a mismatch
classed as a near-tie when, at the first divergence, the worker's token was within TIE of plain's
best logprob (plain's top 5: bf16 ties are often exact, and among more than two tokens).
Appends one row to bench/results/soak.jsonl.

python bench/soak_day.py [--requests 10000] [--concurrency 16] [--kill-at 0.33] [--restart-at 0.5]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import provenance  # noqa: E402
from soak import rss_mb  # noqa: E402
from bf16_match import TIE, below_best, near_tie  # noqa: E402
from soak_mix import classify, one, plan  # noqa: E402
from sglang_dflash.replicas import router_cmd, wait_workers, worker_env  # noqa: E402
from sglang_dflash.testing.servers import LOG_DIR, dflash_state, free_port, launch, stop  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "soak.jsonl")


def worker(model, drafter, i, port):
    labels = ["--enable-metrics", "--extra-metric-labels", '{"worker": "replica-%d"}' % i]
    return launch(model, drafter, "bfloat16", extra=labels, name=f"soak-day-{i}", port=port, env=worker_env(i, 2))


def used_tokens(url: str) -> int | None:
    try:
        loads = requests.get(url + "/v1/loads", timeout=10).json()
        loads = loads if isinstance(loads, list) else loads.get("loads", [loads])
        return sum(int(x.get("num_used_tokens", 0)) for x in loads)
    except (requests.RequestException, ValueError):
        return None


def plain_refs(model: str, jobs: list[dict], done: list[dict], concurrency: int) -> dict:
    """Per prompt with a completed greedy request: plain's greedy output for the longest such request,
    with its top-2 gaps and how far below the best each of its top 5 was."""
    longest: dict[int, int] = {}
    for r in done:
        j = jobs[r["i"]]
        longest[j["prompt"]] = max(longest.get(j["prompt"], 0), j["max_new"])
    prompt_ids = {j["prompt"]: j["ids"] for j in jobs}

    def ref(p):
        sp = {"max_new_tokens": longest[p], "temperature": 0}
        body = {"input_ids": prompt_ids[p], "sampling_params": sp, "return_logprob": True, "top_logprobs_num": 5}
        out = requests.post(plain.url + "/generate", json=body, timeout=1800).json()
        top = out["meta_info"]["output_top_logprobs"]
        return p, {"ids": out["output_ids"], "gap": [t[0][0] - t[1][0] for t in top], "below": below_best(top)}

    with launch(model, None, "bfloat16", name="soak-day-plain") as plain:
        with cf.ThreadPoolExecutor(concurrency) as ex:
            return dict(ex.map(ref, sorted(longest)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kill-at", type=float, default=0.33)
    ap.add_argument("--restart-at", type=float, default=0.5)
    ap.add_argument("--prompts", type=int, default=220, help="distinct unseen chat prompts")
    ap.add_argument("--out", default=RESULTS)
    a = ap.parse_args()
    prov = provenance.stamp()

    from sglang_dflash.drafters import shipped_drafter
    from sglang_dflash.embedded import derive
    from unseen_set import interleaved_prompts

    model, drafter = derive(), shipped_drafter()
    jobs = plan(a.requests, interleaved_prompts(model, a.prompts), random.Random(0))
    front_port, ports = free_port(), [free_port(), free_port()]
    results, marks, lock = [], [], threading.Lock()
    events: dict[str, float] = {}
    with worker(model, drafter, 0, ports[0]) as w0:
        w1_ctx = worker(model, drafter, 1, ports[1])
        w1 = w1_ctx.__enter__()
        os.makedirs(LOG_DIR, exist_ok=True)
        with open(os.path.join(LOG_DIR, f"smg-soak-{front_port}.log"), "w") as log:
            cmd = router_cmd([w0.url, w1.url], "127.0.0.1", front_port, free_port())
            router = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        front = f"http://127.0.0.1:{front_port}"
        wait_workers(front, 2, [router], timeout=120)
        workers = {"w0": w0, "w1": w1}
        kill_n, restart_n = int(a.kill_at * a.requests), int(a.restart_at * a.requests)
        every = max(1, a.requests // 20)
        restarted = []

        def fault_and_marks(n_done: int) -> None:
            if n_done == kill_n:
                events["kill"] = time.time()
                os.killpg(os.getpgid(workers["w1"].proc.pid), signal.SIGKILL)
            if n_done == restart_n:
                events["restart_begin"] = time.time()
                ctx = worker(model, drafter, 1, ports[1])
                workers["w1"] = ctx.__enter__()
                restarted.append(ctx)
                events["restart"] = time.time()
            if n_done % every == 0:
                with lock:
                    errors = sum(r["status"] == "error" for r in results)
                marks.append(
                    {
                        "done": n_done,
                        "t_s": round(time.time() - t0, 1),
                        "errors": errors,  # so far: a window of failures shows when it starts and ends
                        "rss_mb": {k: round(rss_mb(w.proc.pid)) for k, w in workers.items() if w.proc.poll() is None},
                        "kv_used": {k: used_tokens(w.url) for k, w in workers.items()},
                    }
                )

        t0 = time.time()
        with cf.ThreadPoolExecutor(a.concurrency) as ex:
            urls = [w0.url, f"http://127.0.0.1:{ports[1]}"]  # aborts go to the workers (the rid's holder acts)
            futs = [ex.submit(one, front, urls, j) for j in jobs]
            for fut in cf.as_completed(futs):
                rec = fut.result()
                with lock:
                    results.append(rec)
                    n_done = len(results)
                fault_and_marks(n_done)
        wall = time.time() - t0
        time.sleep(3)
        after = {}
        for k, w in workers.items():
            healthy = requests.get(w.url + "/health_generate", timeout=120).status_code == 200
            requests.post(w.url + "/flush_cache", timeout=60)
            time.sleep(1)
            after[k] = {"healthy": healthy, "kv_used_after_flush": used_tokens(w.url), "state": dflash_state(w)}
            after[k]["leak_reported"] = "leak" in w.log().lower()
        stop(router)
        for ctx in restarted:
            ctx.__exit__(None, None, None)
        try:
            w1_ctx.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - killed on purpose
            pass

    row = classify(jobs, results, events)
    greedy = [r for r in results if r["kind"] == "greedy" and r["status"] == "completed"]
    refs = plain_refs(model, jobs, greedy, a.concurrency)
    wrong, ties, gaps = [], 0, []
    for r in greedy:
        want = refs[jobs[r["i"]]["prompt"]]
        got = r["output_ids"]
        j = next((k for k, (x, y) in enumerate(zip(got, want["ids"])) if x != y), None)
        if j is None:
            continue
        gaps.append(want["gap"][j])
        below = want["below"][j].get(got[j])  # None: outside plain's top 5
        if near_tie(below):
            ties += 1
        else:
            wrong.append({"i": r["i"], "at": j, "got": got[j], "want": want["ids"][j], "below_best": below})
    lat = sorted(r["latency"] for r in results if r["status"] == "completed")
    states = [v["state"] for v in after.values()]
    row |= {
        "mix": "day",
        "model": "embedded SmolLM2-135M-Instruct + shipped drafter, bf16, 2 workers behind SMG",
        "requests": a.requests,
        "concurrency": a.concurrency,
        "wall_s": round(wall, 1),
        "latency_p50_s": round(statistics.median(lat), 3) if lat else None,
        "latency_p99_s": round(lat[int(0.99 * (len(lat) - 1))], 3) if lat else None,
        "greedy_checked": len(greedy),
        "greedy_identical": len(greedy) - len(gaps),
        "greedy_near_ties": ties,
        "greedy_wrong": wrong[:20],
        "greedy_wrong_count": len(wrong),
        "tie": TIE,
        "first_gap_median": statistics.median(gaps) if gaps else None,
        "after": {k: {x: y for x, y in v.items() if x != "state"} for k, v in after.items()},
        "draft_failures": sum(s.get("draft_failures", 0) for s in states),
        "draft_steps": sum(s.get("draft_steps", 0) for s in states),
        "marks": marks,
        "rss_growth_mb": {
            k: marks[-1]["rss_mb"][k] - marks[1]["rss_mb"][k]
            for k in ("w0",)
            if len(marks) > 2 and k in marks[1]["rss_mb"] and k in marks[-1]["rss_mb"]
        },
        "events_s": {k: round(v - t0, 1) for k, v in events.items()},
        "argv": provenance.server_argv(model, drafter, "bfloat16", []),
    }
    print(f"run {provenance.append_rows(a.out, [row | provenance.base_fields(prov)], prov)}")
    keys = ("completed", "aborted", "disconnected", "refused", "errors_at_kill", "errors_other", "greedy_checked")
    print({k: row[k] for k in (*keys, "greedy_identical", "greedy_near_ties", "greedy_wrong_count", "draft_failures")})


if __name__ == "__main__":
    main()
