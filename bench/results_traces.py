"""docs/results.md's per-step trace sections: whole traces (width_trace.jsonl) and the per-width
summaries of traces too large to keep (width_summary.jsonl, `width_trace.py --save-as`)."""

from __future__ import annotations

import os
import sys

from results_tables import RESULTS, ROOT, f1, f2, rows, runs, table


def traces() -> list[str]:
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from width_trace import load

    body = []
    for name, steps in load(os.path.join(RESULTS, "width_trace.jsonl")).items():
        tok, secs = sum(sum(s["commits"]) for s in steps), sum(s["all_in"] for s in steps)
        share = {}
        for s in steps:
            share[s["W"]] = share.get(s["W"], 0) + 1
        ws = ", ".join(f"{w}: {100 * n / len(steps):.0f}%" for w, n in sorted(share.items()))
        body.append([f"`{name}`", len(steps), tok, f"{tok / secs:.1f}", ws])
    return table(["real_bench run, trace", "steps", "tokens", "tok/s (all-in)", "widths (steps)"], body)


def width_summary() -> list[str]:
    """Per run: what each (kind of batch, batch bucket, width) realized against what it expected."""
    out = []
    for run, rs in runs(rows("width_summary")).items():
        out += [f"Run `{run}` (traces {', '.join(sorted({r['trace'] for r in rs}))}):", ""]
        body = [
            [r["kind"], r["bs"], r["W"], r["steps"], f2(r["tok_step"]), f2(r["exp_tok_step"])]
            + [f1(r["ms_step"]), f1(r["cost_ms"]), f1(r["tok_s"]), f"{100 * r['share_s']:.1f}%"]
            for r in rs
        ]
        head = ["kind", "bs", "W", "steps", "tok/step", "expected", "ms/step", "cost ms", "tok/s", "time"]
        out += table(head, body) + [""]
    return out
