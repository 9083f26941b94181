"""Where a served run's decode time went, by batch size and verify width, from a step trace
(SGLANG_DFLASH_DEBUG_STEP_TRACE=path on the server): steps, tokens committed per step against the
controller's expectation, all-in seconds per step against its corrected cost, and realized tokens/s.

python bench/width_trace.py [TRACE.jsonl ...] [--save-as RUN]   (default: bench/results/width_trace.jsonl)
A raw trace is one server's steps (or several servers' appended); the results file holds several,
each row tagged with its real_bench `run` and `trace` number, and each is summarized on its own.
Rows are split by kind (greedy, sampled or mixed batches) and batch-size bucket. --save-as RUN appends
the summary rows, tagged with RUN, to bench/results/width_summary.jsonl (raw traces are too large to
keep). A step whose all-in time exceeds IDLE x its stages (plus 50 ms) spans an idle gap between a
bench's rows, not a step, and is left out.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "width_trace.jsonl")
SUMMARY = os.path.join(os.path.dirname(RESULTS), "width_summary.jsonl")
IDLE = 4.0


def load(path: str) -> dict[str, list[dict]]:
    """{trace name: its steps}, one entry per (run, trace) of the file (the path alone for a raw trace)."""
    traces = defaultdict(list)
    with open(path) as f:
        for line in f:
            s = json.loads(line)
            name = f"{s['run']} trace {s['trace']}" if "run" in s else path
            traces[name].append(s)
    out = {}
    for name, steps in traces.items():
        # A step's all-in seconds arrive with the next step (its stages + the scheduler until then).
        for a, b in zip(steps, steps[1:]):
            a["all_in"] = b["prev_all_in"]
        out[name] = [
            s for s in steps if s.get("all_in") is not None and s["all_in"] <= IDLE * sum(s["stages"].values()) + 0.05
        ]
    return out


def expected(s: dict, w: int) -> float:
    """Tokens the controller expected from the step: its rate x cost (per-request estimates summed);
    the pooled estimate where it recorded no rate (a pinned width)."""
    if str(w) in s["rates"] and str(w) in s["cost"]:
        return s["rates"][str(w)] * s["cost"][str(w)]
    return (s["bs"] - s["n_sampled"]) * s["e_greedy"][w - 1] + s["n_sampled"] * s["e_sampled"][w - 1]


def bucket(bs: int) -> str:
    return "1" if bs == 1 else "2-3" if bs < 4 else "4-7" if bs < 8 else "8-15" if bs < 16 else "16+"


def kind(s: dict) -> str:
    return "greedy" if s["n_sampled"] == 0 else "sampled" if s["n_sampled"] == s["bs"] else "mixed"


def summarize(steps: list[dict]) -> list[dict]:
    groups = defaultdict(list)
    for s in steps:
        groups[(kind(s), bucket(s["bs"]), s["W"])].append(s)
    rows = []
    for (k, b, w), ss in sorted(groups.items()):
        n = len(ss)
        tokens = sum(sum(s["commits"]) for s in ss)
        secs = sum(s["all_in"] for s in ss)
        stages = sum(sum(s["stages"].values()) for s in ss)
        want = sum(expected(s, w) for s in ss)
        cost = sum(s["cost"].get(str(w), 0.0) for s in ss)
        rows.append(
            {
                "kind": k,
                "bs": b,
                "W": w,
                "steps": n,
                "rows": sum(s["bs"] for s in ss) / n,
                "tok_step": tokens / n,
                "exp_tok_step": want / n,
                "ms_step": 1e3 * secs / n,
                "stage_ms": 1e3 * stages / n,
                "cost_ms": 1e3 * cost / n,
                "tok_s": tokens / secs,
                "share_s": secs,
            }
        )
    total = sum(r["share_s"] for r in rows)
    for r in rows:
        r["share_s"] = r["share_s"] / total
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--save-as", help="append the summary rows, tagged with this run name, to width_summary.jsonl")
    a = ap.parse_args()
    traces = {name: steps for path in a.paths or [RESULTS] for name, steps in load(path).items()}
    for name, steps in traces.items():
        print(f"{name}: {len(steps)} steps, {sum(sum(s['commits']) for s in steps)} tokens")
        print("   kind   bs     W  steps  rows  tok/step (exp)   ms/step (stages, cost)   tok/s  time share")
        rows = summarize(steps)
        if a.save_as:
            with open(SUMMARY, "a") as f:
                f.writelines(json.dumps({"run": a.save_as, "trace": os.path.basename(name), **r}) + "\n" for r in rows)
        for r in rows:
            print(
                f"{r['kind']:>7s} {r['bs']:>4s} {r['W']:>4d} {r['steps']:>6d} {r['rows']:>5.1f} {r['tok_step']:>6.2f} ({r['exp_tok_step']:>5.2f})"
                f"   {r['ms_step']:>7.1f} ({r['stage_ms']:>6.1f}, {r['cost_ms']:>6.1f})  {r['tok_s']:>7.1f}  {r['share_s']:>6.1%}"
            )


if __name__ == "__main__":
    main()
