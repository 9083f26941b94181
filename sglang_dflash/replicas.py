"""`python -m sglang_dflash.replicas --replicas N [--port P] [sglang_dflash.launch args]`: N DFLASH
servers behind the SGLang gateway (SMG, `smg launch`: cache-aware routing, health checks, retries,
circuit breakers) answering on one port, the same way a cluster runs them (deploy/overlays/router).

Each worker is `python -m sglang_dflash.launch` on its own port (P + 1 + i), with its own metrics
label (`--extra-metric-labels {"worker": "replica-i"}`: SGLang's label, carried by every
`sglang:dflash_*` series) and, on a CPU-only machine, an even share of the cores
(SGLANG_CPU_OMP_THREADS_BIND; its forward runs one thread a core, cpu/cpu_threads.py). SMG talks
to them over HTTP (SGLang's HTTP server; SMG's gRPC mode needs SGLang's gRPC server, which the CPU
build does not start). The gateway's own Prometheus metrics are on
--router-metrics-port (default P + 100). Ctrl-C (SIGINT / SIGTERM) stops everything.

--api-key KEY: every worker requires it (SGLang's --api-key) and so does the gateway (SMG's
--api-key gates its serving routes and is the bearer token it sends to workers); clients send
`Authorization: Bearer KEY`, without it they get 401 (SMG's /workers too); /health stays open.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

from sglang_dflash.cpu_serving import cuda_visible
from sglang_dflash.launch import cpu_binding

ROUTER_POLICY = "cache_aware"


def worker_cmd(i: int, port: int, host: str, args: list[str], api_key: str | None = None) -> list[str]:
    labels = json.dumps({"worker": f"replica-{i}"})
    key = ["--api-key", api_key] if api_key else []
    return [
        sys.executable, "-m", "sglang_dflash.launch", "--host", host, "--port", str(port),
        "--extra-metric-labels", labels, *key, *args,
    ]  # fmt: skip


def router_cmd(
    urls: list[str], host: str, port: int, metrics_port: int, policy: str = ROUTER_POLICY, api_key: str | None = None
) -> list[str]:
    smg = shutil.which("smg") or os.path.join(os.path.dirname(sys.executable), "smg")
    # SMG's one --api-key both gates its clients and authenticates it to workers that were given it
    key = ["--api-key", api_key] if api_key else []
    # Overload protection off: SMG 1.13 leaves a worker with 8 queued requests out of routing while
    # another is "under the thresholds", and a dead worker counts as under them, so with one worker
    # killed it answered 503 no_available_workers to the survivor's traffic too (bench/soak_day.py).
    # The workers queue their own overflow (SGLang's scheduler); cache_aware still balances load.
    return [
        smg, "launch", "--host", host, "--port", str(port), "--worker-urls", *urls, "--policy", policy,
        "--prometheus-port", str(metrics_port), "--health-check-interval-secs", "2",
        "--health-failure-threshold", "2", "--disable-worker-overload-protection", "--log-level", "warn", *key,
    ]  # fmt: skip


def worker_env(i: int, replicas: int) -> dict[str, str]:
    """On CPU, worker i gets its own even share of the cores (threads and their binding)."""
    env = dict(os.environ)
    if not cuda_visible():
        cores = os.cpu_count() or 1
        env["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_binding(replicas, cores).split("|")[i]
    return env


def wait_healthy(url: str, procs: list[subprocess.Popen], timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a process exited while waiting for {url}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not healthy after {timeout:.0f} s")


def keyed(url: str, api_key: str | None) -> urllib.request.Request:
    return urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})


def served_model(url: str, api_key: str | None = None) -> str:
    """The model id SMG routes by (the workers' model path): unlike SGLang's own server it answers
    404 model_not_found to "model": "default"."""
    with urllib.request.urlopen(keyed(url + "/v1/models", api_key), timeout=5) as r:
        return json.load(r)["data"][0]["id"]


def wait_workers(
    url: str, n: int, procs: list[subprocess.Popen], timeout: float = 120, api_key: str | None = None
) -> None:
    """SMG answers /health before it has registered its workers (registration is a background job:
    backend detection, model discovery), and until then routes nothing (404 model_not_found): wait
    for all n in its /workers list (which, unlike /health, needs the gateway's key)."""
    wait_healthy(url, procs, timeout)
    deadline = time.time() + timeout
    while time.time() < deadline:
        with urllib.request.urlopen(keyed(url + "/workers", api_key), timeout=5) as r:
            if json.load(r).get("total", 0) >= n:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{url} registered fewer than {n} workers after {timeout:.0f} s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--router-metrics-port", type=int, default=None)
    ap.add_argument("--policy", default=ROUTER_POLICY)
    # parsed here, not left in the workers' args: the gateway must hold the key the workers require
    ap.add_argument("--api-key", default=None, help="required by every worker and by the gateway")
    a, rest = ap.parse_known_args(argv)
    procs: list[subprocess.Popen] = []

    def stop(*_):
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    urls = []
    for i in range(a.replicas):
        port = a.port + 1 + i
        urls.append(f"http://{a.host}:{port}")
        procs.append(
            subprocess.Popen(
                worker_cmd(i, port, a.host, rest, a.api_key), env=worker_env(i, a.replicas), start_new_session=True
            )
        )
    for url in urls:
        wait_healthy(url, procs)
    metrics_port = a.router_metrics_port or a.port + 100
    router = router_cmd(urls, a.host, a.port, metrics_port, a.policy, a.api_key)
    procs.append(subprocess.Popen(router, start_new_session=True))
    front = f"http://{a.host}:{a.port}"
    wait_workers(front, len(urls), procs, api_key=a.api_key)
    auth = "-H 'Authorization: Bearer <your --api-key>' " if a.api_key else ""  # the key stays out of logs
    chat = {"model": served_model(front, a.api_key), "messages": [{"role": "user", "content": "Hello"}]}
    print(
        f"sglang_dflash.replicas: {a.replicas} DFLASH workers ({', '.join(urls)}) behind SMG at "
        f"{front} (gateway metrics: http://{a.host}:{metrics_port}/metrics); try:\n"
        f"  curl -s {front}/v1/chat/completions -H 'Content-Type: application/json' {auth}"
        f"-d '{json.dumps({**chat, 'max_tokens': 48, 'temperature': 0})}'",
        flush=True,
    )
    while all(p.poll() is None for p in procs):
        time.sleep(1)
    stop()


if __name__ == "__main__":
    main()
