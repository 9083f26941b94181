"""Soak: a long, messy load against the CPU DFLASH server on the tiny steered pair, then checks.

Mix (seeded): prompt lengths 1 .. near the context limit, max_new_tokens 1 .. 512, greedy and
sampled requests, 10% streaming clients that disconnect early, 10% aborted through the API, and a
--max-total-tokens small enough that SGLang must queue and retract. Afterwards: the server is
healthy, the KV pool is empty after a cache flush (and SGLang's strict idle leak check never
fired), scheduler memory is flat between the second and the last hundred requests, and every
completed greedy request equals plain decoding (a plain server started after the DFLASH one).
Every request ends as exactly one of completed / aborted / disconnected / error; a non-2xx answer
(or an error event in a stream) on ANY path, abort and disconnect included, is an error.

python bench/soak.py [--requests 600] [--concurrency 32] [--real]   -> bench/results/soak.jsonl
(--real: the embedded SmolLM2 and the shipped drafter, float32, instead of the tiny steered pair)
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import provenance  # noqa: E402
from sglang_dflash.testing.servers import dflash_state, launch  # noqa: E402

CONTEXT, MAX_TOTAL = 2048, 3072


def plan(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        max_new = max(1, int(math.exp(rng.uniform(0, math.log(512)))))
        plen = max(1, int(math.exp(rng.uniform(0, math.log(CONTEXT - max_new - 8)))))
        kind = rng.choices(["greedy", "sampled", "disconnect", "abort"], [0.4, 0.4, 0.1, 0.1])[0]
        jobs.append(
            {
                "i": i,
                "kind": kind,
                "max_new": max_new,
                "ids": [rng.randrange(3, 380) for _ in range(plen)],
                "delay": rng.uniform(0.2, 2.0),
            }
        )
    return jobs


def one(url: str, job: dict) -> dict:
    sp = {"max_new_tokens": job["max_new"], "temperature": 0}
    if job["kind"] == "sampled":
        sp.update(temperature=0.8, top_p=0.9, sampling_seed=job["i"])
    body = {
        "input_ids": job["ids"],
        "sampling_params": sp,
        "rid": f"soak-{job['i']:05d}.",
    }  # SGLang aborts by rid prefix
    t = time.perf_counter()
    rec = {"i": job["i"], "kind": job["kind"]}
    try:
        if job["kind"] == "disconnect":
            with requests.post(url + "/generate", json={**body, "stream": True}, stream=True, timeout=600) as r:
                if not r.ok:  # refused before streaming: the server failed it, not the client
                    rec.update(status="error", error=f"http{r.status_code}: {r.text[:200]}")
                else:
                    rec["status"] = "disconnected"
                    for n, line in enumerate(r.iter_lines()):
                        # SGLang reports a failure inside a 200 stream as an "error" event.
                        if line.startswith(b"data: {") and "error" in json.loads(line[6:]):
                            rec.update(status="error", error=f"stream error: {line[6:206].decode(errors='replace')}")
                            break
                        if n >= 2:
                            break  # hang up mid-stream
        elif job["kind"] == "abort":
            with cf.ThreadPoolExecutor(1) as ex:
                fut = ex.submit(requests.post, url + "/generate", json=body, timeout=600)
                time.sleep(job["delay"])
                ab = requests.post(url + "/abort_request", json={"rid": body["rid"]}, timeout=60)
                out = fut.result()
            # Either call failing is an error: an abort the server refused, or a generate that came
            # back non-2xx, must not pass as a completed request.
            if not ab.ok:
                rec.update(status="error", error=f"abort_request http{ab.status_code}: {ab.text[:200]}")
            elif not out.ok:
                rec.update(status="error", error=f"http{out.status_code}: {out.text[:200]}")
            else:
                reason = out.json()["meta_info"]["finish_reason"]["type"]
                rec["status"] = "aborted" if reason == "abort" else "completed"
        else:
            r = requests.post(url + "/generate", json=body, timeout=900)
            if not r.ok:
                rec.update(status="error", error=f"http{r.status_code}: {r.text[:200]}")
            else:
                out = r.json()
                aborted = out["meta_info"]["finish_reason"]["type"] == "abort"
                rec.update(
                    status="aborted" if aborted else "completed",
                    output_ids=out["output_ids"],
                    finish=out["meta_info"]["finish_reason"],
                )
    except Exception as e:  # noqa: BLE001 - every failure is a counted figure
        rec.update(status="error", error=f"{type(e).__name__}: {e}"[:200])
    rec["latency"] = time.perf_counter() - t
    return rec


def rss_mb(pid: int) -> float:
    """Resident memory of the server's process group (launcher, scheduler, detokenizer)."""
    pids = subprocess.run(["pgrep", "-g", str(os.getpgid(pid))], capture_output=True, text=True).stdout.split()
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def soak(target: str, drafter: str, n: int, concurrency: int, seed: int = 0, dtype: str = "float32") -> dict:
    jobs = plan(n, seed)
    results, rss, every = [], {}, max(n // 6, 1)  # memory marks: 6 per run (every 100 of 600)
    extra = ["--context-length", str(CONTEXT), "--max-total-tokens", str(MAX_TOTAL), "--enable-metrics"]
    with launch(target, drafter, dtype, extra=extra, name="soak-dflash") as srv:
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(concurrency) as ex:
            for rec in ex.map(lambda j: one(srv.url, j), jobs):
                results.append(rec)
                if len(results) % every == 0:
                    rss[len(results)] = rss_mb(srv.proc.pid)
        wall = time.perf_counter() - t0
        time.sleep(3)
        healthy = requests.get(srv.url + "/health_generate", timeout=120).status_code == 200
        requests.post(srv.url + "/flush_cache", timeout=60)
        time.sleep(1)
        load = requests.get(srv.url + "/v1/loads", timeout=30).json()
        load = load[0] if isinstance(load, list) else load.get("loads", [load])[0]
        metrics = requests.get(srv.url + "/metrics", timeout=30).text
        log = srv.log()
        state = dflash_state(srv)  # the width controller's choices: it must have switched
    retracted = sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("sglang:num_retracted_requests_total")
    )
    greedy = [r for r in results if r["kind"] == "greedy" and r["status"] == "completed"]
    with launch(target, None, dtype, extra=extra[:4], name="soak-plain") as plain:
        with cf.ThreadPoolExecutor(concurrency) as ex:
            refs = list(
                ex.map(lambda r: plain.generate(jobs[r["i"]]["ids"], jobs[r["i"]]["max_new"])["output_ids"], greedy)
            )
    mismatched = [
        {
            "i": r["i"],
            "prompt_len": len(jobs[r["i"]]["ids"]),
            "got": r["output_ids"][:12],
            "want": want[:12],
            "finish": r["finish"],
        }
        for r, want in zip(greedy, refs)
        if r["output_ids"] != want
    ]
    status = [r["status"] for r in results]
    errors: dict[str, int] = {}
    for r in results:
        if r["status"] == "error":
            key = r["error"].split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    lat = sorted(r["latency"] for r in results if r["status"] == "completed")
    marks = sorted(rss)
    return {
        "requests": n,
        "concurrency": concurrency,
        "wall_s": round(wall, 1),
        "completed": status.count("completed"),
        "aborted": status.count("aborted"),
        "disconnected": status.count("disconnected"),
        "errors": errors,
        "error_count": status.count("error"),
        "greedy_checked": len(greedy),
        "greedy_mismatched": mismatched,
        "latency_p50_s": round(statistics.median(lat), 3) if lat else None,
        "latency_p99_s": round(lat[int(0.99 * (len(lat) - 1))], 3) if lat else None,
        "retracted_requests": retracted,
        "healthy": healthy,
        "used_tokens_after_flush": load.get("num_used_tokens"),
        "running_after": load.get("num_running_reqs"),
        "leak_reported": "leak" in log.lower(),
        "rss_mb": {str(k): round(v) for k, v in rss.items()},
        "rss_growth_mb": round(rss[marks[-1]] - rss[marks[1]]) if len(marks) >= 2 else None,
        "width_mode": state.get("width_mode"),
        "width_steps": state.get("width_steps"),
        "argv": {
            "dflash": provenance.server_argv(target, drafter, dtype, extra),
            "plain": provenance.server_argv(target, None, dtype, extra[:4]),
        },
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--real", action="store_true", help="the embedded SmolLM2 + shipped drafter (float32)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "soak.jsonl"))
    args = ap.parse_args()
    prov = provenance.stamp()  # the commit measured, taken before the run writes anything
    if args.real:  # float32, so every greedy output must equal plain decoding exactly
        from sglang_dflash.drafters import shipped_drafter
        from sglang_dflash.embedded import derive

        target, drafter = derive(), shipped_drafter()
    else:
        from sglang_dflash.testing.serve_assets import build_pair

        target, drafter = build_pair(os.path.expanduser("~/.cache/sglang_dflash/serve"))
    fig = soak(target, drafter, args.requests, args.concurrency)
    fig["model"] = "embedded SmolLM2-135M + shipped drafter" if args.real else "tiny steered pair"
    fig.update({k: prov[k] for k in ("commit", "dirty", "dirty_files", "time", "host")})
    print(json.dumps(fig, indent=1))
    provenance.append_rows(args.out, [fig], prov)


if __name__ == "__main__":
    main()
