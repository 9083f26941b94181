"""`make bench-peer`: our servers beside llama.cpp on the embedded model, side by side in one run.

Arms, concurrency 1, the held-out prompts of `make bench`, greedy, every request exactly
--max-new-tokens new tokens (EOS ignored on every side; --stop-at-eos: every side stops at the
model's EOS), tok/s = new tokens / wall clock with prefill:
- `llama.cpp-bf16-t1`, `llama.cpp-bf16-t2`: llama-cpp-python (the same model converted to GGUF in
  bf16) with one and two threads;
- `plain`: SGLang without speculation; `adaptive`: our DFLASH server (the shipped drafter). Both get
  the scheduler flags of `make bench` and run their forward on every core, as `make serve` does
  (srt/cpu_threads.py); a `-t<N>` suffix pins N threads (`adaptive-t1`).
Speedups are paired within a repeat against `llama.cpp-bf16-t1`; arms run ABBA over repeats.

The peer is built on first use and cached under ~/.cache/sglang_dflash/peer (about 10 minutes on 2
cores): a venv with llama-cpp-python built from its PyPI source, and the GGUF converted by the
convert_hf_to_gguf.py vendored in that source. Appends one run to bench/results/peer_bench.jsonl.

python bench/peer_bench.py [--requests 8] [--max-new-tokens 128] [--repeats 2] [--arms ...]
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
import provenance  # noqa: E402
from real_bench import heldout_prompts, run, warm_up  # noqa: E402

LLAMA_CPP_PYTHON = "0.3.36"
PEER = os.path.join(os.path.expanduser("~"), ".cache", "sglang_dflash", "peer")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ARMS = ["llama.cpp-bf16-t1", "llama.cpp-bf16-t2", "plain", "adaptive-t1", "adaptive"]


def sh(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def peer_python() -> str:
    """The peer venv's python, with llama-cpp-python built into it on first use."""
    py = os.path.join(PEER, "venv", "bin", "python")
    if subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode if os.path.exists(py) else 1:
        t = time.time()
        sh([sys.executable, "-m", "venv", os.path.join(PEER, "venv")])
        sh([py, "-m", "pip", "install", "-q", f"llama-cpp-python=={LLAMA_CPP_PYTHON}"])
        print(f"built llama-cpp-python {LLAMA_CPP_PYTHON} in {time.time() - t:.0f} s", flush=True)
    return py


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
    outs = json.loads(p.stdout)
    wall = sum(o["wall_s"] for o in outs)
    return {
        "tok_s": sum(o["tokens"] for o in outs) / wall,
        "wall_s": wall,
        "ttft": [o["ttft_s"] for o in outs],
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
    provenance.add_method_args(ap)
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
    py, gguf = (peer_python(), gguf_for(model)) if needs_peer else (None, None)
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
    rows = []
    base = a.arms[0]
    for name in a.arms:
        rs = [r for r in runs if r["config"] == name]
        paired = [
            r["tok_s"] / b["tok_s"] for r in rs for b in runs if b["config"] == base and b["repeat"] == r["repeat"]
        ]
        rows.append(
            {
                "config": name,
                "concurrency": 1,
                "requests": len(batch),
                "max_new_tokens": a.max_new_tokens,
                **provenance.spread("tok_s", [r["tok_s"] for r in rs]),
                **provenance.spread(f"vs_{base}", paired),
                "ms_per_token": 1000 / (sum(r["tok_s"] for r in rs) / len(rs)),
                "ttft_p50": sorted(x for r in rs for x in r["ttft"])[len(batch) * len(rs) // 2],
                "llama_cpp_python": LLAMA_CPP_PYTHON if name.startswith("llama.cpp") else None,
                "label": a.label,
                "method": f"{'stops at EOS' if eos else 'EOS ignored'}, {a.repeats} repeats ABBA",
                **provenance.base_fields(prov),
            }
        )
    run_name = provenance.append_rows(a.out, rows, prov)
    print(f"run {run_name}{' (dirty tree)' if prov['dirty'] else ''}; {a.repeats} repeats")
    print(f"| arm | tok/s (min-max) | ms/token | vs {base} |\n|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['config']} | {r['tok_s']:.1f} ({r['tok_s_min']:.1f}-{r['tok_s_max']:.1f}) | {r['ms_per_token']:.1f} "
            f"| {r[f'vs_{base}']:.2f}x |"
        )


if __name__ == "__main__":
    main()
