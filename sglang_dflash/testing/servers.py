"""Test harness: start one real SGLang server at a time, send requests, compare with plain decoding."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import requests

from sglang_dflash import env as dflash_env
from sglang_dflash.cpu_serving import ServingDevice, cuda_visible, serving_device

PY = sys.executable
LOG_DIR = dflash_env.TEST_LOGS.get()


_PORT_RNG = random.SystemRandom()  # a test's random.seed() must not make two runs pick the same ports
_GIVEN: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(low: int = 12000, high: int = 21999) -> int:
    """A free port below the kernel's ephemeral range: a server binds its HTTP port seconds after
    start, and a port from bind(0) can meanwhile be handed to one of its own outgoing connections
    or random-port sockets (a --dp-size 2 server lost its port that way). The range also stays
    clear of SGLang's own below-ephemeral picks (22000-29999)."""
    high = min(high, _ephemeral_low() - 1)
    for port in _PORT_RNG.sample(range(low, high + 1), 64):
        if port in _GIVEN:  # two ports asked for before either is bound
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            _GIVEN.add(port)
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


class Server:
    def __init__(self, proc, url, log_path):
        self.proc, self.url, self.log_path = proc, url, log_path

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def generate(self, input_ids, max_new_tokens=32, timeout=600, **sampling):
        body = {
            "input_ids": input_ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, **sampling},
        }
        r = requests.post(self.url + "/generate", json=body, timeout=timeout)
        r.raise_for_status()
        return r.json()

    def post(self, path, body, timeout=600):
        return requests.post(self.url + path, json=body, timeout=timeout)


def server_device(device: str | None = None) -> ServingDevice:
    """The device a test server runs on: `device` ("cuda" or "cpu") if given, else this machine's
    (a CUDA device visible -> cuda). The CPU mode keeps an 8192-token KV pool."""
    if device not in (None, "cuda", "cpu"):
        raise ValueError(f"device={device!r}: expected 'cuda', 'cpu' or None (this machine's)")
    return serving_device(cuda_visible() if device is None else device == "cuda", max_total_tokens=8192)


def server_cmd(
    model: str, draft: str | None, dtype: str, extra: list[str], device: ServingDevice | None = None
) -> list[str]:
    args = ["--model-path", model, "--dtype", dtype, "--host", "127.0.0.1", "--random-seed", "0", "--log-level", "info"]
    for k, v in (device or server_device()).flags.items():
        if k not in extra:
            args += [k] if v is None else [k, v]
    if draft is None:
        return [PY, "-m", "sglang.launch_server", *args, *extra]
    return [PY, "-m", "sglang_dflash.launch", *args, "--speculative-draft-model-path", draft, *extra]


FAULT_ENV = dflash_env.DEBUG_FAIL_DRAFT_EVERY.name


def dflash_state(srv: Server) -> dict:
    """Our worker's live counters from /server_info (summed over DP ranks)."""
    states = requests.get(srv.url + "/server_info", timeout=30).json()["internal_states"]
    out = {}
    for st in states:
        for k, v in st["dflash"].items():
            if isinstance(v, dict) and all(isinstance(n, int) for n in v.values()):  # per-width step counts
                v = {w: n + out.get(k, {}).get(w, 0) for w, n in v.items()}
            elif isinstance(v, dict):  # a table (the start-up profile): the first rank's
                v = out.get(k, v)
            out[k] = v if not isinstance(v, int) else out.get(k, 0) + v
    return out


def assert_no_draft_failures(srv: Server):
    """A drafter that throws degrades to exact plain decoding, so lossless checks alone cannot see it."""
    state = dflash_state(srv)
    assert state["draft_steps"] > 0, f"the drafter never ran: {state}"
    assert state["draft_failures"] == 0, f"draft steps failed: {state}; see {srv.log_path}"


def assert_speculated(outs, min_tau: float = 1.0):
    """DFLASH actually accepted drafts: committed tokens / verify steps > min_tau over these requests."""
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    verify = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    assert verify > 0 and tokens > verify, f"no drafts accepted: {tokens} tokens in {verify} verify steps"
    assert tokens / verify > min_tau, f"tau {tokens / verify:.2f} <= {min_tau}"
    return tokens / verify


@contextlib.contextmanager
def launch(
    model: str,
    draft: str | None = None,
    dtype: str = "float32",
    extra: list[str] = (),
    env: dict | None = None,
    name: str = "server",
    startup_timeout: float = 300,
    port: int | None = None,
    check_drafts: bool = True,
    device: str | None = None,
):
    """check_drafts: a DFLASH server must end with drafted steps and no draft failure (unless the
    test injects faults). device: "cuda" or "cpu"; None: this machine's (server_device)."""
    os.makedirs(LOG_DIR, exist_ok=True)
    port = port or free_port()
    log_path = os.path.join(LOG_DIR, f"{name.replace(os.sep, '_')}-{port}.log")  # a name may hold a path
    dev = server_device(device)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            server_cmd(model, draft, dtype, list(extra), dev) + ["--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dev.environ(os.environ, env),
            start_new_session=True,
        )
    srv = Server(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.time() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode} during start-up:\n{srv.log()[-4000:]}")
            try:
                if requests.get(srv.url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"server not healthy after {startup_timeout}s:\n{srv.log()[-4000:]}")
            time.sleep(0.25)
        yield srv
        plain_width = (env or {}).get(dflash_env.WIDTH.name) == "1"  # pinned to plain decoding: no drafts
        if draft is not None and check_drafts and FAULT_ENV not in (env or {}) and not plain_width:
            assert_no_draft_failures(srv)
    finally:
        stop(proc)


def stop(proc):
    """Kill the server's whole process group at once: on SIGTERM SGLang's launcher sees its scheduler
    die, takes it for a crash and sleeps 5 s before diagnostics, per server, for nothing a test reads."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_failing(model: str, draft: str, dtype="float32", extra=(), timeout=240):
    """Start a DFLASH server expected to fail at start-up; return (exit code, combined output)."""
    port, dev = free_port(), server_device()
    p = subprocess.run(
        server_cmd(model, draft, dtype, list(extra), dev) + ["--port", str(port)],
        env=dev.environ(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )
    return p.returncode, p.stdout + p.stderr


def prompts(n=32, seed=0, vocab=(3, 380), max_len=300):
    """n token-id prompts of mixed lengths (1 .. max_len), deterministic."""
    rng = random.Random(seed)
    lens = [1, 2, 5, max_len] + [rng.randint(3, max_len) for _ in range(n - 4)]
    return [[rng.randrange(*vocab) for _ in range(L)] for L in lens[:n]]


def generate_all(srv: Server, batch, max_new_tokens=32, workers=32, **kw):
    """Send every prompt concurrently; returns the JSON responses in order."""
    with cf.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(lambda p: srv.generate(p, max_new_tokens, **kw), batch))


def reference(srv: Server, batch, max_new_tokens=32):
    """Plain-decoding outputs plus the target's top-2 logprobs at every generated position."""
    outs = generate_all(srv, batch, max_new_tokens)
    refs = []
    for p, o in zip(batch, outs):
        r = srv.post(
            "/generate",
            {
                "input_ids": p,
                "return_logprob": True,
                "top_logprobs_num": 2,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
            },
        ).json()
        assert r["output_ids"] == o["output_ids"], "plain decoding is not deterministic"
        tops = r["meta_info"]["output_top_logprobs"]
        # At an exact tie the top-logprob list may order the two tied tokens either way: the runner-up
        # is the best entry that is not the token plain decoding emitted.
        runner = [next(e for e in t if e[1] != tok) for t, tok in zip(tops, o["output_ids"])]
        gaps = [abs(t[0][0] - e[0]) for t, e in zip(tops, runner)]
        refs.append({"output_ids": o["output_ids"], "gaps": gaps, "runner_up": [e[1] for e in runner]})
    return refs


def assert_lossless(refs, outs, tie: float, max_excused: int | None = None):
    """Token-identical, except at a numerical tie of the target at the first difference: there DFLASH
    must have emitted the plain run's runner-up (its top-2 token) with a top-2 gap < tie. At most
    max_excused prompts (default: one in eight, at least one) may be excused that way."""
    max_excused = max(1, len(refs) // 8) if max_excused is None else max_excused
    excused = 0
    for i, (ref, out) in enumerate(zip(refs, outs)):
        got, want = out["output_ids"], ref["output_ids"]
        if got == want:
            continue
        j = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert j is not None, f"prompt {i}: lengths differ ({len(got)} vs {len(want)}) with equal tokens"
        gap, second = ref["gaps"][j], ref["runner_up"][j]
        print(f"prompt {i}: first difference at output position {j}; target top-2 gap {gap:.3g}")
        assert got[j] == second, (
            f"prompt {i}: DFLASH emitted {got[j]} at {j}, neither top-1 {want[j]} nor top-2 {second}"
        )
        assert gap < tie, f"prompt {i}: DFLASH differs from plain decoding at {j} (gap {gap} >= {tie})"
        excused += 1
    assert excused <= max_excused, f"{excused} prompts differ at near-ties (at most {max_excused} allowed)"


def steered_verify_steps(output_ids, block: int, steer: int = 42) -> int:
    """Verify steps a server must take to emit output_ids when every draft is `steer` (the steered
    tiny drafter): each step accepts the run of `steer` tokens that follows, up to block - 1 of
    them, plus the target's bonus token. The first token comes from the prefill."""
    pos, steps = 1, 0
    while pos < len(output_ids):
        run = 0
        while run < block - 1 and pos + run < len(output_ids) - 1 and output_ids[pos + run] == steer:
            run += 1
        pos, steps = pos + run + 1, steps + 1
    return steps


def dump_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


PENALTIES = [
    {"frequency_penalty": 0.5},
    {"presence_penalty": 0.8},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.8},
    {"frequency_penalty": 0.3, "presence_penalty": 0.2},
    {"min_new_tokens": 24, "stop_token_ids": [42]},
    {"logit_bias": {"42": -2.5, "7": 1.5}},
]


def penalty_cases(batch):
    """(prompt, sampling params) pairs covering every penalty plain decoding applies."""
    return [(p, dict(c)) for p in batch for c in PENALTIES]
