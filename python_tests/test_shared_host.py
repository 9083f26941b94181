"""A DFLASH server launched as a user would (`python -m sglang.launch_server`, none of our launcher's
environment or flags) shares its host: idle, its processes sleep; its forward runs on the threads the
user's OMP_NUM_THREADS asks for, and the log says so (srt/hooks.py cpu_defaults, cpu/cpu_threads.py).
bench/shared_host.py measures what this buys beside a second server."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import requests

from sglang_dflash.cpu.contention import process_ticks
from sglang_dflash.testing.pairs import MIXED
from sglang_dflash.testing.servers import LOG_DIR, free_port

OURS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SGLANG_DFLASH_CPU_THREADS")


def _cpu_seconds(pids) -> float:
    """User + system CPU time of these processes (cpu/contention.py reads them for the governor)."""
    return sum(process_ticks(pid) for pid in pids) / os.sysconf("SC_CLK_TCK")


def _group(pgid: int) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            if os.getpgid(int(pid)) == pgid:
                out.append(int(pid))
    return out


@pytest.fixture(scope="module")
def user_server(pair):
    target, drafter = pair("llama", "float32", MIXED["llama"])
    port = free_port()
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", target, "--port", str(port)]
    argv += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter]
    argv += ["--dtype", "float32", "--device", "cpu", "--max-total-tokens", "8192", "--log-level", "info"]
    environ = {k: v for k, v in os.environ.items() if k not in OURS}
    environ.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1")  # the user's own choice: one thread
    os.makedirs(LOG_DIR, exist_ok=True)
    log_path = os.path.join(LOG_DIR, f"shared-host-{port}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environ, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, open(log_path).read()[-4000:]
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            assert time.time() < deadline, open(log_path).read()[-4000:]
            time.sleep(0.5)
        yield proc, url, log_path
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.server
def test_an_idle_server_sleeps(user_server):
    proc, url, _ = user_server
    body = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    requests.post(url + "/generate", json=body, timeout=300).raise_for_status()
    time.sleep(3)  # past the request's tail and the idle sleeper's grace
    pids = _group(proc.pid)
    before, t0 = _cpu_seconds(pids), time.time()
    time.sleep(5)
    used = (_cpu_seconds(pids) - before) / (time.time() - t0)
    # A scheduler polling its sockets nonstop burns a whole core (~1.0 of a core-second a second).
    assert used < 0.3, f"an idle server used {used:.2f} cores"


@pytest.mark.server
def test_the_users_thread_count_wins_and_is_logged(user_server):
    *_, log_path = user_server
    with open(log_path) as f:
        log = f.read()
    found = re.findall(r"the forward runs on (\d+) OpenMP thread\(s\), set by ([^;]+);", log)
    assert found == [("1", "OMP_NUM_THREADS")], log[-3000:]


@pytest.mark.server
def test_the_schedulers_openmp_threads_spin_briefly(user_server):
    *_, log_path = user_server
    with open(log_path) as f:
        log = f.read()
    assert re.findall(r"OpenMP thread\(s\), set by \S+; GOMP_SPINCOUNT (\S+)", log) == ["10000"], log[-3000:]
