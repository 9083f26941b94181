"""`make bench`: the embedded real model (SmolLM2-135M-Instruct) with and without DFLASH, side by side
in ONE run on this machine: the same server command without speculation and with the shipped
drafter at block sizes 16 and 8, held-out prompts of the drafter's training recipe (never trained
on), concurrency 1 / 4 / 16, temperature 0 and 1.

Per configuration: output tokens/s, speedup (ratio to plain decoding in this run, same
concurrency and temperature), tau (mean and histogram of tokens committed per block, from the
server's sglang:dflash_accept_length histogram), TTFT and inter-token latency p50/p99 (streaming
clients). Writes bench/results/real_bench.jsonl and real_bench.png.

python bench/real_bench.py [--blocks 16 8] [--concurrency 1 4 16] [--temperatures 0 1] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import sys
import time

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "python_tests")]

from harness import launch  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")


def heldout_prompts(tokenizer, n: int) -> list[list[int]]:
    from sglang_dflash.train.prompts import generate

    rows = [p for p in generate(3000) if p["split"] == "heldout"][:n]
    return [list(tokenizer.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]) for p in rows]


def stream_one(url: str, ids: list[int], max_new: int, temperature: float, seed: int) -> dict:
    sp = {"max_new_tokens": max_new, "temperature": temperature}
    if temperature > 0:
        sp["sampling_seed"] = seed
    t0 = time.perf_counter()
    times, meta = [], {}
    with requests.post(url + "/generate", json={"input_ids": ids, "sampling_params": sp, "stream": True},
                       stream=True, timeout=1800) as r:
        r.raise_for_status()
        seen = 0
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            meta = json.loads(line[6:])["meta_info"]
            new = meta["completion_tokens"] - seen
            if new > 0:
                times.append((time.perf_counter(), new))
                seen = meta["completion_tokens"]
    ttft = times[0][0] - t0 if times else float("nan")
    gaps = [(b[0] - a[0]) / b[1] for a, b in zip(times, times[1:])]  # per token, chunks may hold several
    return {"tokens": meta.get("completion_tokens", 0), "verify_ct": meta.get("spec_verify_ct", 0),
            "ttft": ttft, "itl": gaps}


def accept_hist(url: str) -> tuple[dict[int, float], dict[str, float]]:
    """Cumulative sglang:dflash_accept_length bucket counts {le: count} and stage seconds {stage: s}."""
    out, stages = {}, {}
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("sglang:dflash_accept_length_bucket"):
            le = line.split('le="')[1].split('"')[0]
            if le != "+Inf":
                out[int(float(le))] = out.get(int(float(le)), 0) + float(line.split()[-1])
        for stage in ("draft", "verify", "kv_write"):
            if line.startswith(f"sglang:dflash_{stage}_seconds_sum"):
                stages[stage] = stages.get(stage, 0.0) + float(line.split()[-1])
    return out, stages


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


def run(srv, batch, conc, max_new, temp):
    before, st0 = accept_hist(srv.url)
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(conc) as ex:
        outs = list(ex.map(lambda a: stream_one(srv.url, a[1], max_new, temp, a[0]), enumerate(batch)))
    wall = time.perf_counter() - t
    after, st1 = accept_hist(srv.url)
    stage_s = {k: round(st1[k] - st0.get(k, 0.0), 3) for k in st1}
    cum = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(after)}
    hist = {k: cum[k] - cum.get(k - 1, 0) for k in cum}
    toks, vct = sum(o["tokens"] for o in outs), sum(o["verify_ct"] for o in outs)
    itl = [g for o in outs for g in o["itl"]]
    ttft = [o["ttft"] for o in outs]
    return {"concurrency": conc, "temperature": temp, "requests": len(outs), "tokens": toks,
            "tok_s": toks / wall, "tau_mean": toks / vct if vct else 1.0,
            "tau_hist": {str(k): int(v) for k, v in hist.items() if v}, "wall_s": round(wall, 2),
            "stage_s": stage_s,
            "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99), "itl_p50": pct(itl, 0.5), "itl_p99": pct(itl, 0.99)}


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(2, len(temps), figsize=(5 * len(temps), 7), squeeze=False)
    for col, temp in enumerate(temps):
        for cfg in sorted({r["config"] for r in rows}):
            rs = sorted((r for r in rows if r["config"] == cfg and r["temperature"] == temp),
                        key=lambda r: r["concurrency"])
            xs = [r["concurrency"] for r in rs]
            axes[0][col].plot(xs, [r["tok_s"] for r in rs], marker="o", label=cfg)
            axes[1][col].plot(xs, [r["tau_mean"] for r in rs], marker="o", label=cfg)
        for row, name in enumerate(["output tokens/s", "tau (tokens per verify)"]):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
            ax.set_ylabel(name)
            ax.set_title(f"SmolLM2-135M, temperature {temp}")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--draft")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--blocks", type=int, nargs="+", default=[16, 8])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default=os.path.join(RESULTS, "real_bench.jsonl"))
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from sglang_dflash.drafters import shipped_drafter
    from sglang_dflash.embedded import derive

    a.model = a.model or derive()
    a.draft = a.draft or shipped_drafter()
    batch = heldout_prompts(AutoTokenizer.from_pretrained(a.model), a.requests)
    rows = []
    for block in [None, *a.blocks]:
        extra = ["--enable-metrics"] + ([] if block is None else ["--speculative-num-draft-tokens", str(block)])
        with launch(a.model, None if block is None else a.draft, a.dtype, extra=extra,
                    name=f"real-bench-{block or 'plain'}") as srv:
            run(srv, batch[:2], 2, 8, 0.0)  # warm-up
            for temp in a.temperatures:
                for c in a.concurrency:
                    n = max(c, min(len(batch), 2 * c if c > 1 else 6))
                    row = {"config": "plain" if block is None else f"dflash-b{block}",
                           **run(srv, batch[:n], c, a.max_new_tokens, temp)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    base = {(r["concurrency"], r["temperature"]): r["tok_s"] for r in rows if r["config"] == "plain"}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(a.out, "w") as f:
        for r in rows:
            r["speedup"] = r["tok_s"] / base[(r["concurrency"], r["temperature"])]
            r["time"] = stamp
            f.write(json.dumps(r) + "\n")
    plot(rows, a.out.replace(".jsonl", ".png"))
    print("| config | T | conc | tok/s | speedup | tau | TTFT p50/p99 s | ITL p50/p99 ms |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['temperature']:g} | {r['concurrency']} | {r['tok_s']:.1f} | {r['speedup']:.2f}x "
              f"| {r['tau_mean']:.2f} | {r['ttft_p50']:.2f} / {r['ttft_p99']:.2f} "
              f"| {1000 * r['itl_p50']:.0f} / {1000 * r['itl_p99']:.0f} |")


if __name__ == "__main__":
    main()
