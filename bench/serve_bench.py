"""Side-by-side serving benchmark in ONE run: the same server command without speculation and
with DFLASH (block sizes given), at several concurrencies. Writes JSONL (one row per config) and
prints a table; ratios (speedup) are against plain decoding measured in this same run.

python bench/serve_bench.py --model M --draft D [--blocks 16 8] [--concurrency 1 4 16]
(no --model: the tiny steered pair `make serve` uses)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "python_tests")]

from harness import generate_all, launch, prompts  # noqa: E402


def run_config(srv, batch, conc, max_new, temperature):
    t = time.perf_counter()
    outs = generate_all(srv, batch, max_new, workers=conc, temperature=temperature)
    wall = time.perf_counter() - t
    toks = sum(o["meta_info"]["completion_tokens"] for o in outs)
    taus = [o["meta_info"].get("spec_accept_length", 1.0) for o in outs]
    lat = [o["meta_info"]["e2e_latency"] for o in outs]
    return {"concurrency": conc, "requests": len(outs), "tok_s": toks / wall, "tau_mean": statistics.mean(taus),
            "latency_p50": statistics.median(lat), "latency_p99": sorted(lat)[int(0.99 * (len(lat) - 1))]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--draft")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--blocks", type=int, nargs="+", default=[16, 8])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/serve_bench.jsonl"))
    a = ap.parse_args()
    if not a.model:
        from sglang_dflash.testing.serve_assets import build_pair

        a.model, a.draft = build_pair(os.path.expanduser("~/.cache/sglang_dflash/serve"))
    batch = prompts(a.requests, seed=2, max_len=256)
    rows = []
    for block in [None, *a.blocks]:
        extra = [] if block is None else ["--speculative-num-draft-tokens", str(block)]
        with launch(a.model, None if block is None else a.draft, a.dtype, extra=extra,
                    name=f"bench-{block or 'plain'}") as srv:
            generate_all(srv, batch[:2], 8)  # warm-up
            for c in a.concurrency:
                rows.append({"config": "plain" if block is None else f"dflash-b{block}",
                             **run_config(srv, batch, c, a.max_new_tokens, a.temperature)})
    base = {r["concurrency"]: r["tok_s"] for r in rows if r["config"] == "plain"}
    with open(a.out, "w") as f:
        for r in rows:
            r["speedup"] = r["tok_s"] / base[r["concurrency"]]
            f.write(json.dumps(r) + "\n")
    print("| config | concurrency | tok/s | speedup | tau | p50 s | p99 s |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['concurrency']} | {r['tok_s']:.1f} | {r['speedup']:.2f}x | {r['tau_mean']:.2f} "
              f"| {r['latency_p50']:.3f} | {r['latency_p99']:.3f} |")


if __name__ == "__main__":
    main()
