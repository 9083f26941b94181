"""The day mix of bench/soak_day.py: what each request is, how it is sent, and how a run is counted."""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import random
import time

import requests

KINDS = {  # kind -> share of the day
    "greedy": 0.35,
    "seeded": 0.12,
    "sampled": 0.18,
    "structured": 0.05,
    "stream": 0.10,
    "abort": 0.05,
    "disconnect": 0.10,
    "bad": 0.05,
}
SCHEMA = json.dumps(
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name"]}
)
# Bad requests a client sends by mistake; each must be refused with a 4xx naming the field.
BAD = [
    {"sampling_params": {"max_new_tokens": -1}},
    {"sampling_params": {"max_new_tokens": 8, "temperature": -0.5}},
    {"sampling_params": {"max_new_tokens": 8, "top_p": 1.5}},
    {"input_ids": [1, 10**7, 2], "sampling_params": {"max_new_tokens": 8}},
]
KILL_GRACE_S = 10.0  # the gateway's health check takes this long to stop routing to a dead worker


def plan(n: int, prompts: list[list[int]], rng: random.Random) -> list[dict]:
    kinds, weights = zip(*KINDS.items())
    jobs = []
    for i in range(n):
        p = rng.randrange(len(prompts))
        kind = rng.choices(kinds, weights)[0]
        max_new = max(1, int(math.exp(rng.uniform(0, math.log(256)))))
        sp = {"max_new_tokens": max_new, "temperature": 0}
        if kind == "seeded":
            sp.update(temperature=0.7, top_p=0.95, sampling_seed=i)
        elif kind == "sampled":
            sp.update(temperature=rng.choice([0.7, 1.0]))
        elif kind == "structured":
            sp.update(json_schema=SCHEMA, max_new_tokens=max(max_new, 64))
        body = {"input_ids": prompts[p], "sampling_params": sp, "rid": f"day-{i:05d}."}
        if kind == "bad":
            body = {"input_ids": prompts[p], **BAD[i % len(BAD)], "rid": f"day-{i:05d}."}
        jobs.append({"i": i, "kind": kind, "prompt": p, "ids": prompts[p], "max_new": max_new, "body": body})
        jobs[-1]["delay"] = rng.uniform(0.2, 2.0)
    return jobs


def _stream(url: str, body: dict, hang_up: bool) -> dict:
    with requests.post(url + "/generate", json={**body, "stream": True}, stream=True, timeout=900) as r:
        if not r.ok:
            return {"status": "error", "error": f"http{r.status_code}: {r.text[:200]}"}
        last = None
        for n, line in enumerate(r.iter_lines()):
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:  # SGLang reports a failure inside a 200 stream as an error event
                return {"status": "error", "error": f"stream error: {str(event)[:200]}"}
            last = event
            if hang_up and n >= 2:
                return {"status": "disconnected"}
        if last is None:
            return {"status": "error", "error": "stream ended without an event"}
        aborted = last["meta_info"]["finish_reason"]["type"] == "abort"
        return {"status": "aborted" if aborted else "completed"}


def _abort(front: str, workers: list[str], body: dict, delay: float) -> dict:
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(requests.post, front + "/generate", json=body, timeout=900)
        time.sleep(delay)
        for url in workers:  # the worker holding the rid aborts it; the other knows nothing of it
            try:
                requests.post(url + "/abort_request", json={"rid": body["rid"]}, timeout=30)
            except requests.RequestException:
                pass  # a worker that is down holds nothing to abort
        out = fut.result()
    if not out.ok:
        return {"status": "error", "error": f"http{out.status_code}: {out.text[:200]}"}
    aborted = out.json()["meta_info"]["finish_reason"]["type"] == "abort"
    return {"status": "aborted" if aborted else "completed"}


def one(front: str, workers: list[str], job: dict) -> dict:
    rec = {"i": job["i"], "kind": job["kind"], "start": time.time()}
    t = time.perf_counter()
    try:
        if job["kind"] in ("stream", "disconnect"):
            rec |= _stream(front, job["body"], hang_up=job["kind"] == "disconnect")
        elif job["kind"] == "abort":
            rec |= _abort(front, workers, job["body"], job["delay"])
        else:
            r = requests.post(front + "/generate", json=job["body"], timeout=900)
            if job["kind"] == "bad":
                ok = 400 <= r.status_code < 500
                rec |= (
                    {"status": "refused"}
                    if ok
                    else {"status": "error", "error": f"bad request got http{r.status_code}"}
                )
            elif not r.ok:
                rec |= {"status": "error", "error": f"http{r.status_code}: {r.text[:200]}"}
            else:
                out = r.json()
                finish = out["meta_info"]["finish_reason"]
                rec |= {"status": "aborted" if finish["type"] == "abort" else "completed", "finish": finish}
                rec["output_ids"] = out["output_ids"]
                if job["kind"] == "structured" and finish["type"] == "stop":
                    try:
                        json.loads(out["text"])
                    except ValueError:
                        rec |= {"status": "error", "error": f"structured output not JSON: {out['text'][:100]}"}
    except Exception as e:  # noqa: BLE001 - every failure is a counted figure
        rec |= {"status": "error", "error": f"{type(e).__name__}: {e}"[:200]}
    rec["latency"], rec["end"] = time.perf_counter() - t, time.time()
    return rec


def classify(jobs: list[dict], results: list[dict], events: dict) -> dict:
    """Counts by status and kind; errors split into those in flight when the worker was killed
    (started before kill + KILL_GRACE_S, ended after the kill) and the rest."""
    kill = events.get("kill")
    status = [r["status"] for r in results]

    def at_kill(r):
        return kill is not None and r["start"] <= kill + KILL_GRACE_S and r["end"] >= kill

    errors = [r for r in results if r["status"] == "error"]
    other = [r for r in errors if not at_kill(r)]
    kinds: dict[str, dict] = {}
    for r in results:
        kinds.setdefault(r["kind"], {}).setdefault(r["status"], 0)
        kinds[r["kind"]][r["status"]] += 1
    return {
        "answered": len(results),
        "completed": status.count("completed"),
        "aborted": status.count("aborted"),
        "disconnected": status.count("disconnected"),
        "refused": status.count("refused"),
        "errors_at_kill": len(errors) - len(other),
        "errors_other": len(other),
        "error_kinds": sorted({r["error"].split(":")[0] for r in errors}),
        "errors_other_sample": [r["error"] for r in other[:10]],
        "by_kind": kinds,
        "lost": len(jobs) - len(results),
    }
