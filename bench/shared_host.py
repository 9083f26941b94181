"""Two DFLASH servers on one host, launched as a user would (`python -m sglang.launch_server
--speculative-algorithm DFLASH`, no core binding, no CPU environment set by us).

Per arm, in one run on this machine (the embedded model, bf16, greedy chat requests of
--max-new-tokens tokens with ignore_eos, sent one at a time by each server's client):
- `alone`: server A by itself;
- `beside_idle`: A while a second server B is up and idle (B's time to healthy recorded too);
- `both_busy`: A and B serving at once, each with its own client.
Each number is output tok/s; the ratios are over `alone` (targets: beside an idle server >= 0.9x,
each of two busy servers >= 0.35x, the fair share being 0.5x).

An arm adds environment to both servers (`--arm NAME KEY=VAL ...`): the default arm adds nothing,
so it measures what a user gets. Appends one run to bench/results/shared_host.jsonl.

python bench/shared_host.py [--requests 6] [--max-new-tokens 64] [--arm spin0 GOMP_SPINCOUNT=0]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import os
import subprocess
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402

from sglang_dflash.cpu_serving import CPU_ENGINE_VAR  # noqa: E402
from sglang_dflash.drafters import shipped_drafter  # noqa: E402
from sglang_dflash.embedded import derive  # noqa: E402
from sglang_dflash.testing.servers import free_port, stop  # noqa: E402

PROMPTS = [
    "Write a Python function that merges two sorted lists.",
    "Explain what a hash map is and when to use one.",
    "Write a shell command that counts the lines of every .py file in a folder.",
    "Describe how TCP differs from UDP.",
    "Write a Python class for a stack with push, pop and peek.",
    "What does the `yield` keyword do in Python?",
]
# What a user's shell would not have: our own launcher's CPU environment.
OURS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SGLANG_DFLASH_CPU_THREADS")


def start(name: str, port: int, extra_env: dict, log_dir: str) -> tuple[subprocess.Popen, float]:
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", derive(), "--port", str(port)]
    argv += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", shipped_drafter()]
    argv += ["--dtype", "bfloat16", "--device", "cpu", "--max-total-tokens", "16384"]
    environ = {k: v for k, v in os.environ.items() if k not in OURS}
    environ.update({CPU_ENGINE_VAR: "1", **extra_env})  # the one variable SGLang needs on a CPU
    log = open(os.path.join(log_dir, f"{name}-{port}.log"), "w")
    # cwd: a folder without the package, so PYTHONPATH (an arm's checkout) decides which code serves
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=environ, cwd=log_dir, start_new_session=True
    )
    t0, url = time.perf_counter(), f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; log: {log.name}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, time.perf_counter() - t0
        if time.perf_counter() - t0 > 900:
            raise TimeoutError(f"{name} not healthy in 900 s; log: {log.name}")
        time.sleep(0.5)


def serve(port: int, n: int, max_new: int) -> float:
    """Output tok/s of n greedy chat requests sent one after another."""
    url, tokens, t0 = f"http://127.0.0.1:{port}/v1/chat/completions", 0, time.perf_counter()
    for i in range(n):
        body = {
            "model": "default",
            "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            "max_tokens": max_new,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = requests.post(url, json=body, timeout=1800)
        r.raise_for_status()
        tokens += r.json()["usage"]["completion_tokens"]
    return tokens / (time.perf_counter() - t0)


def warm(port: int) -> None:
    serve(port, 2, 8)


def run_arm(name: str, extra_env: dict, n: int, max_new: int, log_dir: str) -> dict:
    pa, pb = free_port(), free_port()
    a, start_a = start(f"{name}-A", pa, extra_env, log_dir)
    b = None
    try:
        warm(pa)
        alone = serve(pa, n, max_new)
        b, start_b = start(f"{name}-B", pb, extra_env, log_dir)
        time.sleep(5)  # B idle, past its start-up
        idle = serve(pa, n, max_new)
        warm(pb)
        with cf.ThreadPoolExecutor(2) as ex:
            fa, fb = ex.submit(serve, pa, n, max_new), ex.submit(serve, pb, n, max_new)
            busy_a, busy_b = fa.result(), fb.result()
    finally:
        stop(a)
        if b is not None:
            stop(b)
    r = lambda x: round(x / alone, 3)  # noqa: E731
    return {
        "arm": name,
        "env": extra_env,
        "alone_tok_s": round(alone, 2),
        "beside_idle_tok_s": round(idle, 2),
        "both_busy_tok_s": [round(busy_a, 2), round(busy_b, 2)],
        "beside_idle_ratio": r(idle),
        "both_busy_ratio": [r(busy_a), r(busy_b)],
        "start_alone_s": round(start_a, 1),
        "start_beside_idle_s": round(start_b, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--arm", nargs="+", action="append", default=[], metavar=("NAME", "KEY=VAL"))
    ap.add_argument("--no-default-arm", action="store_true", help="only the --arm arms")
    ap.add_argument("--label", help="what this run compares, kept in every row")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "shared_host.jsonl"))
    args = ap.parse_args()
    arms = [] if args.no_default_arm else [("default", {})]
    arms += [(a[0], dict(kv.split("=", 1) for kv in a[1:])) for a in args.arm]
    prov = provenance.stamp()
    log_dir = os.path.join(os.path.expanduser("~"), ".cache", "sglang_dflash", "bench_logs")
    os.makedirs(log_dir, exist_ok=True)
    rows = []
    for name, extra in arms:
        row = run_arm(name, extra, args.requests, args.max_new_tokens, log_dir)
        print(row, flush=True)
        rows.append({**provenance.base_fields(prov), **row, "label": args.label, "requests": args.requests})
    run = provenance.append_rows(args.out, rows, prov)
    print(f"appended run {run} to {args.out}")


if __name__ == "__main__":
    main()
