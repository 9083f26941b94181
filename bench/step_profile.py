"""Where a decode step's time goes in the served DFLASH worker: a Python sampling profile (py-spy,
SGLang's own dependency) of the scheduler process under a steady load, split into stages.

For each (verify width pinned, concurrency): start the embedded model's DFLASH server with
SGLANG_DFLASH_WIDTH=W, keep `concurrency` long requests running, sample the scheduler for
--seconds, and count decode steps from /server_info (width_steps). Each sample is charged to the
first stage (leaf upward) whose rule matches a frame; ms/step = share x seconds / steps. The same
window is first timed with no sampler running (`ms_per_step_unsampled`: the step a user gets).

python bench/step_profile.py [--widths 1 8] [--concurrency 1 16] [--seconds 20]
-> rows appended to bench/results/step_profile.jsonl as one run (date + commit) and a table on stdout.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import append_rows, base_fields, stamp  # noqa: E402

# (stage, substrings of a frame): the first match from the leaf upward wins
STAGES = [
    (
        "norm/rope/act",
        ("layernorm", "rotary_embedding", "activation.py", "rms_norm", "rope_forward", "_norm (", "_rope ("),
    ),
    ("gemm", ("_gemm (", "linear.py", "F.linear", "(linear)", "matmul", "apply_weights", "logits_processor.py")),
    (
        "attention",
        ("torch_native_backend", "radix_attention", "scaled_dot_product", "pipeline/attention", "torch_native_verify"),
    ),
    ("sgl_kernel stand-ins", ("sgl_kernel_cpu.py",)),
    ("draft (ours)", ("pipeline/draft.py", "model/drafter.py", "context_kv.py", "srt/draft_head.py")),
    ("sample/accept (ours)", ("target_sampling.py", "accept.py", "penalties.py", "grammar_mask.py")),
    (
        "model (other ops)",
        ("models/llama.py", "models/qwen", "model_runner.py", "verify_backend.py", "llama_stack.py", "cpu_target.py"),
    ),
    ("worker bookkeeping (ours)", ("sglang_dflash/",)),
    ("idle (waiting for work)", ("recv_requests", "_poll", "zmq", "sleep", "select")),
    ("scheduler + IPC (SGLang)", ("scheduler", "sglang/srt/managers", "tokenizer", "detokenizer")),
]


def stage_of(stack: list[str]) -> str:
    for frame in reversed(stack):  # leaf first
        for name, keys in STAGES:
            if any(k in frame for k in keys):
                return name
    return "other"


def scheduler_pid(server_pid: int) -> int:
    out = subprocess.run(["pgrep", "-g", str(os.getpgid(server_pid)), "-f", "sglang::scheduler"], capture_output=True)
    pids = [int(p) for p in out.stdout.split()]
    if not pids:  # process titles not set: the busiest child
        kids = subprocess.run(["pgrep", "-P", str(server_pid)], capture_output=True).stdout.split()
        pids = [int(p) for p in kids]
    return pids[0]


def steps(url: str) -> int:
    st = requests.get(url + "/server_info", timeout=30).json()["internal_states"]
    return sum(sum(s["dflash"].get("width_steps", {}).values()) for s in st)


def profile(srv, concurrency: int, seconds: float) -> dict:
    stop = threading.Event()

    def client(i):
        body = {
            "input_ids": [100 + (i * 37 + k) % 20000 for k in range(64)],
            "sampling_params": {"max_new_tokens": 512, "temperature": 0, "ignore_eos": True},
        }
        while not stop.is_set():
            requests.post(srv.url + "/generate", json=body, timeout=600)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    time.sleep(5)  # every request decoding
    pid = scheduler_pid(srv.proc.pid)
    raw = tempfile.mktemp(suffix=".txt")
    # The same window with no sampler first: py-spy reads the scheduler's memory from a process of its
    # own, which on a 2-core host takes CPU from the forward's second thread.
    s0 = steps(srv.url)
    time.sleep(seconds)
    clean_steps = steps(srv.url) - s0
    s0 = steps(srv.url)
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    subprocess.run([spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200", "-f", "raw", "-o", raw,
                    "--full-filenames", "--idle", "--nonblocking"], check=True, capture_output=True)  # fmt: skip
    n_steps = steps(srv.url) - s0
    stop.set()
    counts, leaves = collections.Counter(), collections.Counter()
    with open(raw) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            # The scheduler's main thread (not its watchdog or tqdm threads): spawned, its stack starts at
            # <module>; forked from `python -m sglang.launch_server` (cpu/fork_start.py), at runpy's two frames.
            if any(f.startswith("<module>") for f in frames[:3]):
                counts[stage_of(frames)] += int(n)
                leaves[frames[-1].split(" (")[0][:80]] += int(n)
    os.remove(raw)
    total = sum(counts.values())
    return {
        "steps": n_steps,
        "seconds": seconds,
        "ms_per_step": 1000 * seconds / max(1, n_steps),
        "ms_per_step_unsampled": 1000 * seconds / max(1, clean_steps),
        "stages_ms_per_step": {k: 1000 * seconds * v / total / max(1, n_steps) for k, v in counts.most_common()},
        "top_leaves_ms_per_step": {k: 1000 * seconds * v / total / max(1, n_steps) for k, v in leaves.most_common(20)},
    }


def parse_arm(spec: str) -> tuple[str, dict]:
    """ "NAME" or "NAME:VAR=V,VAR=V" -> (NAME, {VAR: V}); an item naming no upper-case VAR continues the
    value before it (`NAME:SGLANG_DFLASH_CPU_OPS=linear=0,stack=loop`)."""
    name, _, assigns = spec.partition(":")
    env, last = {}, None
    for kv in filter(None, assigns.split(",")):
        key, _, value = kv.partition("=")
        if last is None or key.isupper():
            env[key], last = value, key
        else:
            env[last] += "," + kv
    return name, env


def main():
    from sglang_dflash.drafters import shipped_drafter
    from sglang_dflash.embedded import derive
    from sglang_dflash.testing.servers import launch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16"], help="each a run of its own servers, side by side")
    ap.add_argument(
        "--arms",
        nargs="+",
        default=["default"],
        help="NAME or NAME:VAR=V,VAR=V: servers with these environment variables, side by side (before/after)",
    )
    a = ap.parse_args()
    prov = stamp()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "step_profile.jsonl")
    model, drafter = derive(), shipped_drafter()
    rows = []
    arms = [parse_arm(s) for s in a.arms]
    for dtype in a.dtypes:
        for w in a.widths:
            for arm, extra in arms:
                env = {"SGLANG_DFLASH_WIDTH": str(w), **extra}
                name = f"profile-{dtype}-w{w}-{arm}"
                with launch(model, drafter, dtype, env=env, name=name, check_drafts=False) as srv:
                    for c in a.concurrency:
                        row = {"width": w, "concurrency": c, "dtype": dtype, "arm": arm, "env": extra}
                        row.update(profile(srv, c, a.seconds))
                        rows.append({**row, **base_fields(prov)})
                        print(json.dumps(row), flush=True)
    print("run", append_rows(out, rows, prov), "->", os.path.relpath(out))
    print(table(rows))


def table(rows) -> str:
    stages = [s for s, _ in STAGES] + ["other"]
    head = (
        "| stage (ms per step) | "
        + " | ".join(f"{r['dtype']} {r.get('arm', '')} W={r['width']} c={r['concurrency']}" for r in rows)
        + " |"
    )
    lines = [head, "|---|" + "---:|" * len(rows)]
    for s in stages:
        vals = [r["stages_ms_per_step"].get(s, 0.0) for r in rows]
        if any(v >= 0.05 for v in vals):
            lines.append(f"| {s} | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
    lines.append("| **step** | " + " | ".join(f"**{r['ms_per_step']:.1f}**" for r in rows) + " |")
    if all("ms_per_step_unsampled" in r for r in rows):
        lines.append("| step, no sampler | " + " | ".join(f"{r['ms_per_step_unsampled']:.1f}" for r in rows) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
