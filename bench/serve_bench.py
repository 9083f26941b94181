"""Side-by-side serving benchmark in ONE run: the same server command without speculation and
with DFLASH (arms as in real_bench.py: plain, fixed<W>, adaptive), at several concurrencies. Writes JSONL (one row per config and
concurrency) and prints a table; ratios (speedup) are against plain decoding measured in this run.

Same design as real_bench.py (see bench/provenance.py): every arm gets the scheduler flags DFLASH
forces (--no-match-sched drops them, and rows say so); --repeats N runs the whole arm sequence N
times in ABBA order, a fresh server per arm and repeat, each with the same warm-up (2 prompts x 8
tokens, excluded) and a prefix-cache flush before every row; a speedup is paired within a repeat
and rows report mean/min/max/stdev over repeats; tau = committed tokens / verify steps; every row
carries the commit, a dirty flag and both arms' server argv.

python bench/serve_bench.py --model M --draft D [--arms plain fixed16 adaptive] [--concurrency 1 4 16] [--repeats 2]
(no --model: the tiny steered pair `make serve` uses)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import provenance  # noqa: E402
from sglang_dflash.testing.servers import generate_all, launch, prompts  # noqa: E402


def run_config(srv, batch, conc, max_new, temperature):
    provenance.flush_cache(srv.url)  # no row starts with an earlier row's prefix cache
    t = time.perf_counter()
    outs = generate_all(srv, batch, max_new, workers=conc, temperature=temperature)
    wall = time.perf_counter() - t
    metas = [o["meta_info"] for o in outs]
    return {
        "concurrency": conc,
        "requests": len(outs),
        "metas": metas,
        "tok_s": sum(m["completion_tokens"] for m in metas) / wall,
        "latency": [m["e2e_latency"] for m in metas],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--draft")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--arms", nargs="+", default=["plain", "fixed16", "adaptive"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.0)
    provenance.add_method_args(ap)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/serve_bench.jsonl"))
    a = ap.parse_args()
    prov = provenance.stamp()  # before anything is written
    if not a.model:
        from sglang_dflash.testing.serve_assets import build_pair

        a.model, a.draft = build_pair(os.path.expanduser("~/.cache/sglang_dflash/serve"))
    batch = prompts(a.requests, seed=2, max_len=256)
    arms = {name: provenance.arm(name, a.draft, [], a.match_sched) for name in a.arms}
    argv = {cfg: provenance.server_argv(a.model, d, a.dtype, extra) for cfg, (d, extra, _) in arms.items()}
    runs = []
    for rep in range(a.repeats):
        for cfg in provenance.arm_order(list(arms), rep):
            draft, extra, env = arms[cfg]
            with launch(a.model, draft, a.dtype, extra=extra, env=env, name=f"bench-{cfg}-r{rep}") as srv:
                run_config(srv, batch[:2], 2, 8, a.temperature)  # warm-up, identical for every arm
                for c in a.concurrency:
                    runs.append(
                        {"config": cfg, "repeat": rep, **run_config(srv, batch, c, a.max_new_tokens, a.temperature)}
                    )
    rows = []
    for (cfg, conc), agg in provenance.summarize(runs, ("concurrency",)).items():
        lat = sorted(x for r in runs if (r["config"], r["concurrency"]) == (cfg, conc) for x in r["latency"])
        rows.append(
            {
                "config": cfg,
                "concurrency": conc,
                "temperature": a.temperature,
                "requests": len(batch),
                "max_new_tokens": a.max_new_tokens,
                **agg,
                "latency_p50": statistics.median(lat),
                "latency_p99": lat[int(0.99 * (len(lat) - 1))],
                **provenance.row_fields(prov, argv, cfg, a.match_sched),
                "env": arms[cfg][2],
            }
        )
    with open(a.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(
        f"commit {prov['commit']}{' (dirty tree)' if prov['dirty'] else ''}; {a.repeats} repeats; "
        f"scheduler flags matched: {a.match_sched}"
    )
    print(
        "| config | concurrency | tok/s (min-max) | speedup (min-max) | tau | p50 s | p99 s |\n"
        "|---|---|---|---|---|---|---|"
    )
    for r in rows:
        tau = "-" if r["tau"] is None else f"{r['tau']:.2f}"
        print(
            f"| {r['config']} | {r['concurrency']} | {r['tok_s']:.1f} ({r['tok_s_min']:.1f}-{r['tok_s_max']:.1f}) "
            f"| {r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) | {tau} "
            f"| {r['latency_p50']:.3f} | {r['latency_p99']:.3f} |"
        )


if __name__ == "__main__":
    main()
