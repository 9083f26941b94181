"""`make bench`: the embedded real model (SmolLM2-135M-Instruct) served three ways, side by side in
ONE run on this machine, held-out prompts of the drafter's training recipe (never trained on),
concurrency 1 / 4 / 16 / 32, temperature 0 and 1 (seeded and unseeded):
- `plain`: SGLang without speculation;
- `w1`: our worker with the verify width pinned to 1 (SGLANG_DFLASH_WIDTH=1): our CPU step, no
  speculation;
- `adaptive`: DFLASH as shipped (the drafter's block, cost-aware verify width).
Optional arms (provenance.arm): `fixed<W>` (width pinned to W), `adaptive<B>`, `-t<N>`, `+<rule>`...

Each row carries two paired ratios (within one repeat, mean with min-max over repeats): `cpu_step`
= w1 / plain (what our step alone gives) and `spec_share` = the row's arm / w1 (for `adaptive`:
what speculation itself gives), beside `speedup` = the arm / plain.

Design (so a noisy 2-core machine cannot decide a ratio; one server at a time):
- Every request decodes exactly --max-new-tokens (EOS ignored) by default, so every arm does the
  same work: bf16 greedy arms otherwise stop at different places. --stop-at-eos: stop at EOS.
- plain gets SGLang's CPU defaults (overlap scheduling on); the DFLASH arms get what the plugin
  forces (no overlap, 48 running requests). --match-sched gives plain those flags too. Each row
  records which (`sched_matched`, `sched_flags`, `sched_note`).
- --repeats N (default 2): the arm sequence runs N times in ABBA order, a fresh server per arm and
  repeat, each with the same warm-up (excluded); the prefix cache is flushed before every row.
- --sampled seeded|unseeded|both (default both): T>0 rows with sampling_seed, without it (the
  DFlash 1 q proposal rules), or both.

Per row: output tok/s, the ratios, tau (provenance.tau; the sglang:dflash_accept_length histogram
as tau_hist), verify widths (steps per width), seconds per stage, TTFT / ITL p50/p99, and the
provenance (commit, dirty flag, host with ISA and memory bandwidth, every arm's server argv).
Appends one run to bench/results/real_bench.jsonl; bench/results_page.py draws the README headline.

python bench/real_bench.py [--arms plain w1 adaptive] [--concurrency 1 4 16 32] [--temperatures 0 1]
    [--repeats 2] [--sampled both] [--stop-at-eos] [--match-sched] [--waves 2] [--prompts heldout] [--tiny]
--waves N (default 2): a row sends N times its requests (c, 2c below 16, at least 6) through c
clients; with few waves a row measures mostly its ragged tail (requests speculated at different
rates finish apart, the last ones decoding at a smaller batch).
--prompts unseen: kinds of text no training run reads (bench/unseen_set.py --fresh) instead of the
drafter recipe's held-out prompts.
--inline-w1: every speculating arm's rows also run with each request capped at width 1 on the same
server (`<arm>~w1`, custom_params.dflash_max_width = 1: the server decoding plainly), one wave of
the row's requests at a time, each run both ways in ABBA order; `inline_share` = the arm / its twin,
free of the server-to-server pace a separate `w1` server's ratio carries (10-15% between lifetimes
on a 2-core host) and of the drift between minutes inside one.
--tiny: the tiny generated pair of `make serve-tiny` (float32, random prompts, concurrency
1 / 4 / 16 at temperature 0) instead of the embedded model; appends to bench/results/tiny_bench.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import provenance  # noqa: E402
from results_tables import f2, spread, table, widths  # noqa: E402
from served_row import pct, run, run_pair, warm_up  # noqa: E402
from sglang_dflash import env as dflash_env  # noqa: E402
from sglang_dflash.testing.servers import launch  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
PROGRESS = ("config", "repeat", "temperature", "seeded", "concurrency", "tok_s")  # printed per row as it lands


def heldout_prompts(tokenizer, n: int) -> list[list[int]]:
    from sglang_dflash.train.prompts import generate

    rows = [p for p in generate(3000) if p["split"] == "heldout"][:n]
    return [
        list(
            tokenizer.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )
        for p in rows
    ]


def collate(runs, prov, argv, match_sched, max_new, baseline="plain"):
    """Per (config, temperature, seeded, concurrency): spreads over repeats, pooled latencies and
    histogram. Speedups are over `baseline` (plain, or the first arm of a run without plain)."""
    keys = ("temperature", "seeded", "concurrency")
    summary = provenance.summarize(runs, keys, baseline)
    rows = []
    for (cfg, temp, seeded, conc), agg in summary.items():
        rs = [r for r in runs if (r["config"], *(r[k] for k in keys)) == (cfg, temp, seeded, conc)]
        hist, stage, widths = {}, {}, {}
        for r in rs:
            for k, v in r["hist"].items():
                hist[k] = hist.get(k, 0) + v
            for k, v in r.get("widths", {}).items():
                widths[k] = widths.get(k, 0) + v
            for k, v in r["stage_s"].items():
                stage[k] = stage.get(k, 0.0) + v
        itl, ttft = [g for r in rs for g in r["itl"]], [x for r in rs for x in r["ttft"]]
        rows.append(
            {
                "config": cfg,
                "temperature": temp,
                "seeded": seeded,
                "concurrency": conc,
                "requests": rs[0]["requests"],
                "max_new_tokens": max_new,
                **agg,
                "speedup_over": baseline,
                "tau_hist": {str(k): int(v) for k, v in sorted(hist.items()) if v},
                "width_steps": {str(k): int(v) for k, v in sorted(widths.items()) if v},
                "wall_s_runs": [round(r["wall_s"], 2) for r in rs],
                "stage_s": {k: round(v, 3) for k, v in stage.items()},
                "ttft_p50": pct(ttft, 0.5),
                "ttft_p99": pct(ttft, 0.99),
                "itl_p50": pct(itl, 0.5),
                "itl_p99": pct(itl, 0.99),
                **provenance.row_fields(prov, argv, cfg, match_sched, baseline),
            }
        )
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--draft")
    ap.add_argument("--dtype", help="default: bfloat16 (float32 with --tiny)")
    ap.add_argument("--arms", nargs="+", help="default: plain, w1, adaptive")
    ap.add_argument("--concurrency", type=int, nargs="+", help="default: 1 4 16 32 (1 4 16 with --tiny)")
    ap.add_argument("--temperatures", type=float, nargs="+", help="default: 0 1 (0 with --tiny)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompts", choices=("heldout", "unseen"), default="heldout", help="see --prompts above")
    ap.add_argument("--waves", type=int, default=2, help="rows send N x their requests: more hold the batch full")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    seeded = "T>0 rows with sampling_seed, without it (DFlash 1 q proposal rules), or both"
    ap.add_argument("--sampled", choices=("seeded", "unseeded", "both"), default="both", help=seeded)
    eos = "requests stop at EOS (default: every request decodes exactly --max-new-tokens in every arm)"
    ap.add_argument("--stop-at-eos", dest="ignore_eos", action="store_false", help=eos)
    ap.add_argument("--ignore-eos", action="store_true", help=argparse.SUPPRESS)  # the default; kept for old commands
    ap.add_argument("--tiny", action="store_true", help="the tiny steered pair instead of the embedded model")
    ap.add_argument("--label", help="what this run compares, kept in every row (docs/results.md shows it)")
    ap.add_argument("--inline-w1", action="store_true", help="see --inline-w1 above")
    provenance.add_method_args(ap)
    ap.add_argument("--out", help="default: bench/results/real_bench.jsonl (tiny_bench.jsonl with --tiny)")
    a = ap.parse_args()
    prov = provenance.stamp()  # before anything is written

    a.dtype = a.dtype or ("float32" if a.tiny else "bfloat16")
    a.concurrency = a.concurrency or ([1, 4, 16] if a.tiny else [1, 4, 16, 32])
    a.temperatures = a.temperatures or ([0.0] if a.tiny else [0.0, 1.0])
    a.out = a.out or os.path.join(RESULTS, "tiny_bench.jsonl" if a.tiny else "real_bench.jsonl")
    if a.tiny:
        from sglang_dflash.testing.serve_assets import build_pair
        from sglang_dflash.testing.servers import prompts

        if not a.model:
            a.model, a.draft = build_pair(os.path.expanduser("~/.cache/sglang_dflash/serve"))
        batch = prompts(a.requests, seed=2, max_len=256)
    else:
        from transformers import AutoTokenizer

        from sglang_dflash.drafters import shipped_drafter
        from sglang_dflash.embedded import derive

        a.model = a.model or derive()
        a.draft = a.draft or shipped_drafter()
        n = max(a.requests, 32 * a.waves)
        from unseen_set import interleaved_prompts

        tok = AutoTokenizer.from_pretrained(a.model)
        batch = interleaved_prompts(a.model, n) if a.prompts == "unseen" else heldout_prompts(tok, n)
    a.arms = a.arms or ["plain", "w1", "adaptive"]
    seeding = {"seeded": [True], "unseeded": [False], "both": [True, False]}[a.sampled]
    arms = {name: provenance.arm(name, a.draft, ["--enable-metrics"], a.match_sched) for name in a.arms}
    argv = {cfg: provenance.server_argv(a.model, d, a.dtype, extra) for cfg, (d, extra, _) in arms.items()}
    argv.update({f"{cfg}~w1": v for cfg, v in list(argv.items())})  # a twin row runs on its arm's server
    runs = []
    for rep in range(a.repeats):
        for cfg in provenance.arm_order(list(arms), rep):
            draft, extra, env = arms[cfg]
            with launch(a.model, draft, a.dtype, extra=extra, env=env, name=f"real-bench-{cfg}-r{rep}") as srv:
                warm_up(srv, batch, a.temperatures)
                for temp, seeded in [(t, s) for t in a.temperatures for s in (seeding if t > 0 else [True])]:
                    for i, c in enumerate(a.concurrency):
                        n = min(len(batch), a.waves * max(c, 2 * c if c < 16 else c, 6))
                        args = (srv, batch[:n], c, a.max_new_tokens, temp, seeded, a.ignore_eos)
                        if a.inline_w1 and draft is not None and env.get(dflash_env.WIDTH.name) != "1":
                            pair = run_pair(*args, chunks=a.waves, flip=(rep + i) % 2 == 1)
                            rows = list(zip([cfg, cfg + "~w1"], pair))
                        else:
                            rows = [(cfg, run(*args))]
                        for name, got in rows:
                            r = {"config": name, "repeat": rep, **got}
                            print(json.dumps({k: r[k] for k in PROGRESS}), flush=True)
                            runs.append(r)
    baseline = "plain" if "plain" in a.arms else a.arms[0]
    rows = collate(runs, prov, argv, a.match_sched, a.max_new_tokens, baseline)
    for r in rows:
        r["env"], r["ignore_eos"] = arms[r["config"].removesuffix("~w1")][2], a.ignore_eos
        r["max_width"] = 1 if r["config"].endswith("~w1") else None  # every request's cap
        r["waves"], r["prompts"] = a.waves, a.prompts
        if a.label:
            r["label"] = a.label
    run_name = provenance.append_rows(a.out, rows, prov)
    dirty = " (dirty tree)" if prov["dirty"] else ""
    print(f"run {run_name}{dirty}; {a.repeats} repeats; EOS ignored: {a.ignore_eos}; sched matched: {a.match_sched}")
    head = ["config", "T", "seeded", "conc", "tok/s", "speedup", "cpu step w1/plain", "spec share /w1"]
    head += ["in-lifetime share", "tau", "widths"]
    shares = ("speedup", "cpu_step", "spec_share", "inline_share")
    body = [
        [r["config"], f"{r['temperature']:g}", r["seeded"], r["concurrency"], spread(r, "tok_s")]
        + [spread(r, k, f2, "x") if r.get(k) is not None else None for k in shares]
        + [f2(r["tau"]), widths(r)]
        for r in rows
    ]
    print("\n".join(table(head, body)))


if __name__ == "__main__":
    main()
