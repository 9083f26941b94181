"""`make bench-peer`: our server beside llama.cpp on the embedded model, side by side in one run.

Arms, concurrency 1, the held-out prompts of `make bench`, greedy, every request exactly
--max-new-tokens new tokens (EOS ignored on every side; --stop-at-eos: every side stops at the
model's EOS), tok/s = new tokens / wall clock with prefill:
- `llama.cpp-bf16-t1`, `llama.cpp-bf16-t2`: llama-cpp-python (the same model converted to GGUF in
  bf16) on one and two threads;
- `adaptive-t1`, `adaptive-t2`: our DFLASH server (the shipped drafter) with its forward on one and
  two OpenMP threads (SGLANG_DFLASH_CPU_THREADS); `adaptive`: our default (every core of the rank).
  Any real_bench arm works (`plain`, `w1-t1`...), with the scheduler flags of `make bench`.
The table's headline compares EQUAL threads: each `-t<N>` arm paired with `llama.cpp-bf16-t<N>` in
the same repeat (`vs_llama_equal_threads`); our default sits beside, paired with llama.cpp on as
many threads as it used. Arms run ABBA over --repeats (default 3).

The peer is built on first use and cached under ~/.cache/sglang_dflash/peer (about 8 minutes on 2
cores): a venv with llama-cpp-python built from its PyPI source with CMAKE_ARGS (GGML_NATIVE: tuned
to the building CPU), and the GGUF converted by the convert_hf_to_gguf.py vendored in that source.
The build records its version, CMake flags and the CPU's flags in venv/build.json; a host whose
flags differ rebuilds it (a native build can use instructions another CPU lacks). Every row records
that build and llama.cpp's llama_print_system_info(). Appends to bench/results/peer_bench.jsonl.

python bench/peer_bench.py [--requests 8] [--max-new-tokens 128] [--repeats 3] [--arms ...]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_probe  # noqa: E402
import provenance  # noqa: E402
from real_bench import heldout_prompts  # noqa: E402
from results_cpu import equal_threads_table  # noqa: E402
from served_row import run, warm_up  # noqa: E402

LLAMA_CPP_PYTHON = "0.3.36"
# GGML_NATIVE: -march=native, the build a CPU user makes for their own machine.
CMAKE_ARGS = "-DGGML_NATIVE=ON"
PEER = os.path.join(os.path.expanduser("~"), ".cache", "sglang_dflash", "peer")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ARMS = ["llama.cpp-bf16-t1", "adaptive-t1", "llama.cpp-bf16-t2", "adaptive-t2", "adaptive"]
LLAMA = "llama.cpp-bf16-t"


def sh(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def wanted_build() -> dict:
    """What the cached peer must have been built as, on this host."""
    model, flags = host_probe.cpuinfo()
    return {
        "llama_cpp_python": LLAMA_CPP_PYTHON,
        "cmake_args": CMAKE_ARGS,
        "cpu": model,
        "isa": host_probe.isa(flags),
        "cpu_flags": sorted(flags),
    }


def rebuild_reason(recorded: dict | None, want: dict) -> str | None:
    """Why the cached build cannot be reused (None: reuse it). Every CPU flag counts, not only the
    ISA ones: -march=native may emit any extension the building CPU had."""
    if recorded is None:
        return "no recorded build"
    for key in ("llama_cpp_python", "cmake_args"):
        if recorded.get(key) != want[key]:
            return f"{key}: built {recorded.get(key)!r}, want {want[key]!r}"
    have, need = set(recorded.get("cpu_flags") or []), set(want["cpu_flags"])
    if have != need:
        return f"CPU flags differ: this host adds {sorted(need - have)[:8]}, lacks {sorted(have - need)[:8]}"
    return None


def peer_python() -> tuple[str, dict]:
    """The peer venv's python and its build record; llama-cpp-python is (re)built from source when
    the record is missing or names another version, CMake flags or CPU."""
    venv = os.path.join(PEER, "venv")
    py, record = os.path.join(venv, "bin", "python"), os.path.join(venv, "build.json")
    want = wanted_build()
    try:
        with open(record) as f:
            have = json.load(f)
    except (OSError, ValueError):
        have = None
    why = rebuild_reason(have, want)
    if why is None and subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return py, have
    print(f"building llama-cpp-python {LLAMA_CPP_PYTHON} ({why or 'import failed'})", flush=True)
    t = time.time()
    sh([sys.executable, "-m", "venv", "--clear", venv])
    env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "FORCE_CMAKE": "1"}
    pip = [py, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-binary", "llama-cpp-python"]
    sh([*pip, f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], env=env)
    want["build_s"] = round(time.time() - t)
    with open(record, "w") as f:
        json.dump(want, f)
    return py, want


def gguf_for(model: str) -> str:
    """model (an HF folder) -> its bf16 GGUF, converted once by llama.cpp's own script."""
    out = os.path.join(PEER, os.path.basename(os.path.normpath(model)) + "-bf16.gguf")
    if os.path.exists(out):
        return out
    src = os.path.join(PEER, "src")
    if not glob.glob(os.path.join(src, "llama_cpp_python-*", "vendor")):
        os.makedirs(src, exist_ok=True)
        sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", src,
            f"llama-cpp-python=={LLAMA_CPP_PYTHON}"])  # fmt: skip
        with tarfile.open(glob.glob(os.path.join(src, "*.tar.gz"))[0]) as tf:
            tf.extractall(src, filter="data")
    vendor = glob.glob(os.path.join(src, "llama_cpp_python-*", "vendor", "llama.cpp"))[0]
    env = {**os.environ, "PYTHONPATH": os.path.join(vendor, "gguf-py")}
    sh([sys.executable, os.path.join(vendor, "convert_hf_to_gguf.py"), model, "--outtype", "bf16", "--outfile", out + ".tmp"], env=env)  # fmt: skip
    os.replace(out + ".tmp", out)
    return out


def llama_row(py: str, gguf: str, threads: int, batch: list[list[int]], max_new: int, eos: list[int]) -> dict:
    p = subprocess.run(
        [py, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_llama.py"),
         "--gguf", gguf, "--threads", str(threads), "--max-new", str(max_new), "--eos", *map(str, eos)],
        input=json.dumps(batch), capture_output=True, text=True, check=True,
    )  # fmt: skip
    got = json.loads(p.stdout)
    outs = got["outs"]
    wall = sum(o["wall_s"] for o in outs)
    return {
        "tok_s": sum(o["tokens"] for o in outs) / wall,
        "wall_s": wall,
        "ttft": [o["ttft_s"] for o in outs],
        "llama_system_info": got["system_info"],
        "llama_version": got["version"],
    }


def server_row(model, draft, dtype, name, batch, max_new, match_sched, rep, ignore_eos) -> dict:
    from sglang_dflash.testing.servers import launch

    d, extra, env = provenance.arm(name, draft, ["--enable-metrics"], match_sched)
    with launch(model, d, dtype, extra=extra, env=env, name=f"peer-bench-{name}-r{rep}") as srv:
        warm_up(srv, batch, [0.0])
        r = run(srv, batch, 1, max_new, 0.0, ignore_eos=ignore_eos)
    r.pop("metas")
    return r


def eos_ids(model: str, tok) -> list[int]:
    """The ids SGLang stops at: the generation config's eos_token_id(s), else the tokenizer's."""
    try:
        with open(os.path.join(model, "generation_config.json")) as f:
            ids = json.load(f).get("eos_token_id")
    except OSError:
        ids = None
    ids = tok.eos_token_id if ids is None else ids
    return [ids] if isinstance(ids, int) else list(ids)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", default=ARMS)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--label")
    ap.add_argument(
        "--stop-at-eos",
        action="store_true",
        help="every side stops at the model's EOS (default: exactly --max-new-tokens)",
    )
    ap.add_argument("--out", default=os.path.join(RESULTS, "peer_bench.jsonl"))
    provenance.add_method_args(ap, repeats=3)
    a = ap.parse_args()
    prov = provenance.stamp()
    from transformers import AutoTokenizer

    from sglang_dflash.drafters import shipped_drafter
    from sglang_dflash.embedded import derive

    model, draft = derive(), shipped_drafter()
    tok = AutoTokenizer.from_pretrained(model)
    batch = heldout_prompts(tok, a.requests)
    eos = eos_ids(model, tok) if a.stop_at_eos else []
    needs_peer = any(arm.startswith("llama.cpp") for arm in a.arms)
    (py, build), gguf = (peer_python(), gguf_for(model)) if needs_peer else ((None, None), None)
    runs = []
    for rep in range(a.repeats):
        for name in provenance.arm_order(a.arms, rep):
            if name.startswith("llama.cpp"):
                r = llama_row(py, gguf, int(name.rsplit("-t", 1)[1]), batch, a.max_new_tokens, eos)
            else:
                r = server_row(model, draft, a.dtype, name, batch, a.max_new_tokens, a.match_sched, rep, not eos)
            r.update(config=name, repeat=rep, concurrency=1, temperature=0.0)
            print(json.dumps({k: r[k] for k in ("config", "repeat", "tok_s")}), flush=True)
            runs.append(r)
    base, cores = a.arms[0], host_probe.cores()
    equal = equal_thread_ratios(runs, cores)
    llama = next((r for r in runs if "llama_system_info" in r), {})
    rows = []
    for name in a.arms:
        rs = [r for r in runs if r["config"] == name]
        paired = [
            r["tok_s"] / b["tok_s"] for r in rs for b in runs if b["config"] == base and b["repeat"] == r["repeat"]
        ]
        rows.append(
            {
                "config": name,
                "threads": threads_of(name, cores),
                "concurrency": 1,
                "requests": len(batch),
                "max_new_tokens": a.max_new_tokens,
                **provenance.spread("tok_s", [r["tok_s"] for r in rs]),
                **provenance.spread(f"vs_{base}", paired),
                **(provenance.spread("vs_llama_equal_threads", equal[name]) if name in equal else {}),
                "ms_per_token": 1000 / (sum(r["tok_s"] for r in rs) / len(rs)),
                "ttft_p50": sorted(x for r in rs for x in r["ttft"])[len(batch) * len(rs) // 2],
                "llama_cpp_python": LLAMA_CPP_PYTHON if name.startswith("llama.cpp") else None,
                "llama_build": build,
                "llama_system_info": llama.get("llama_system_info"),
                "label": a.label,
                "method": f"{'stops at EOS' if eos else 'EOS ignored'}, {a.repeats} repeats ABBA",
                **provenance.base_fields(prov),
            }
        )
    run_name = provenance.append_rows(a.out, rows, prov)
    print(f"run {run_name}{' (dirty tree)' if prov['dirty'] else ''}; {a.repeats} repeats")
    print("\n".join(equal_threads_table(rows)))


def threads_of(arm: str, default: int) -> int:
    """An arm's thread count: its `-t<N>` suffix, else our default (every core of the rank)."""
    base, _, n = arm.rpartition("-t")
    return int(n) if base and n.isdigit() else default


def equal_thread_ratios(runs: list[dict], default: int) -> dict[str, list[float]]:
    """{our arm: [its tok/s / llama.cpp's on as many threads, one per repeat where both ran]}."""
    llama = {(r["repeat"], threads_of(r["config"], default)): r["tok_s"] for r in runs if r["config"].startswith(LLAMA)}
    out: dict[str, list[float]] = {}
    for r in runs:
        key = (r["repeat"], threads_of(r["config"], default))
        if not r["config"].startswith(LLAMA) and key in llama:
            out.setdefault(r["config"], []).append(r["tok_s"] / llama[key])
    return out


if __name__ == "__main__":
    main()
