"""Markdown tables of each results kind (bench/results/<kind>.jsonl), for bench/results_page.py."""

from __future__ import annotations

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")


def rows(kind: str) -> list[dict]:
    with open(os.path.join(RESULTS, f"{kind}.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def runs(rs: list[dict]) -> dict[str, list[dict]]:
    """{run: its rows}, newest run first."""
    out: dict[str, list[dict]] = {}
    for r in rs:
        out.setdefault(r["run"], []).append(r)
    return dict(sorted(out.items(), key=lambda kv: min(str(r.get("time")) for r in kv[1]), reverse=True))


def table(head: list[str], body: list[list]) -> list[str]:
    fmt = lambda row: "| " + " | ".join("-" if v is None else str(v) for v in row) + " |"  # noqa: E731
    return [fmt(head), "|" + "---|" * len(head), *map(fmt, body)]


def f1(x):
    return None if x is None else f"{x:.1f}"


def f2(x):
    return None if x is None else f"{x:.2f}"


def spread(r: dict, key: str, fmt=f1, unit="") -> str:
    mid, lo, hi = r[key], r.get(f"{key}_min"), r.get(f"{key}_max")
    return f"{fmt(mid)}{unit}" if lo is None or lo == hi else f"{fmt(mid)}{unit} ({fmt(lo)}-{fmt(hi)})"


def widths(r: dict) -> str:
    steps = r.get("width_steps") or {}
    total = sum(steps.values())
    pct = lambda n: f"{100 * n / total:.0f}%" if 100 * n >= 0.5 * total else "<1%"  # noqa: E731
    return ", ".join(f"{w}: {pct(n)}" for w, n in steps.items()) if total else "-"


def about(rs: list[dict]) -> str:
    r = rs[0]
    files = ", ".join((r.get("dirty_files") or [])[:3])
    dirty = (f" (dirty tree: {files})" if files else " (dirty tree)") if r.get("dirty") else ""
    host = r.get("host") or {}
    where = f"; host {host.get('cpus')} x {host.get('cpu')}" + (f", {host['gpus'][0]}" if host.get("gpus") else "")
    return f"commit `{r['commit'][:7]}`{dirty}, measured {str(r.get('time'))[:16]}{where if host else ''}"


# ---- tables, one per kind ------------------------------------------------------------------------
def served(kind: str) -> list[str]:
    out = []
    for run, rs in runs(rows(kind)).items():
        r0 = rs[0]
        opts = [f"{r0.get('max_new_tokens')} new tokens", f"{r0.get('repeats')} repeat(s) ABBA"]
        opts += ["--ignore-eos"] * bool(r0.get("ignore_eos")) + ["unseeded"] * (r0.get("seeded") is False)
        out += [f"### `{run}`" + (f": {r0['label']}" if r0.get("label") else ""), ""]
        out += [f"{about(rs)}; {', '.join(opts)}.", ""]
        lat = "latency_p50" in r0
        over = r0.get("speedup_over", "plain")
        head = ["config", "T", "conc", "tok/s (min-max)", f"speedup over {over} (min-max)", "tau", "widths"]
        head += ["latency p50/p99 s"] if lat else ["TTFT p50/p99 s", "ITL p50/p99 ms"]
        body = []
        for r in rs:
            row = [r["config"], f"{r['temperature']:g}", r["concurrency"], spread(r, "tok_s")]
            row += [spread(r, "speedup", f2, "x"), f2(r["tau"]), widths(r)]
            if lat:
                row.append(f"{r['latency_p50']:.2f} / {r['latency_p99']:.2f}")
            else:
                row += [
                    f"{r['ttft_p50']:.2f} / {r['ttft_p99']:.2f}",
                    f"{1e3 * r['itl_p50']:.0f} / {1e3 * r['itl_p99']:.0f}",
                ]
            body.append(row)
        out += table(head, body) + [""]
    return out


def soak() -> list[str]:
    head = ["run", "model", "requests", "completed / aborted / disconnected", "errors", "greedy checked / mismatched"]
    head += ["p50 / p99 s", "KV after flush", "RSS growth MB", "widths (steps)"]
    body = [
        [f"`{r['run']}`", r.get("model", "tiny steered pair"), r["requests"]]
        + [f"{r['completed']} / {r['aborted']} / {r['disconnected']}", r["error_count"]]
        + [
            f"{r['greedy_checked']} / {len(r['greedy_mismatched'])}",
            f"{r['latency_p50_s']:.1f} / {r['latency_p99_s']:.1f}",
        ]
        + [r["used_tokens_after_flush"], r["rss_growth_mb"], widths(r)]
        for r in rows("soak")
        if r.get("mix") != "day"  # a day of traffic: results_host.soak_day
    ]
    return table(head, body)


# ---- drafters -------------------------------------------------------------------------------------
def walks(r: dict | None) -> str | None:
    if r is None:
        return None
    return " / ".join(f"{r['widths'][w]['tau']:.3f}" if w in r["widths"] else "-" for w in ("4", "8", "16"))


def drafter_arms() -> list[str]:
    out = []
    for run, rs in runs(rows("drafter_arms")).items():
        out += [f"### `{run}`: {rs[0]['label']}", "", about(rs) + ".", ""]
        names = list(dict.fromkeys(r["name"] for r in rs))
        body = []
        for n in names:
            tem = next((r for r in rs if r["name"] == n and r["heldout_set"] == "templated"), None)
            uns = next((r for r in rs if r["name"] == n and r["heldout_set"] == "unseen"), None)
            any_ = tem or uns
            tr = any_["training"]
            train = f"{tr['train_s'] / 60:.0f} min, {tr['tok_s']:.0f} tok/s" if tr.get("train_s") else None
            w4 = any_["widths"].get("4", {})
            body.append([n, f"{any_['layers']} / {any_['block']}", walks(tem), walks(uns), w4.get("draft_ms")])
            body[-1] += [f"{any_['predicted_speedup']:.2f}x (W{any_['best_width']})", train]
        head = ["drafter", "layers / block", "templated tau W4 / W8 / W16", "unseen tau W4 / W8 / W16"]
        out += table(head + ["draft ms (W4)", "predicted c=1", "training"], body) + [""]
        out += sampled_walks(rs)
    return out


def sampled_walks(rs: list[dict]) -> list[str]:
    """Rows with sampled walks (train/sampled_walk.py): expected tokens per verify step at the whole
    block, greedy beside each temperature's proposal rules."""
    rs = [r for r in rs if r.get("sampled_walk")]
    if not rs:
        return []
    keys = [(t, rule) for r in rs for t in r["sampled_walk"] if t != "T0" for rule in r["sampled_walk"][t]]
    keys = list(dict.fromkeys(keys))  # DFlash 1 (argmax / q1 / qall) and DFlash 2 (argmax / path) rows
    body = []
    for r in rs:
        sw, w = r["sampled_walk"], str(r["block"])
        body.append([r["name"], f"{r['heldout_set']} ({r['heldout']})", f"{sw['T0']['argmax'][w]:.3f}"])
        body[-1] += [f"{sw[t][rule][w]:.3f}" if rule in sw.get(t, {}) else "-" for t, rule in keys]
    head = ["drafter", "set (answers)", "greedy"] + [f"{t} {rule}" for t, rule in keys]
    return ["Sampled walks (expected tokens per verify step, whole block verified):", ""] + table(head, body) + [""]


def training() -> list[str]:
    body = []
    for r in rows("train_summary"):
        curve = ", ".join(f"{h['tokens'] / 1e6:.1f}M {h['tau']:.3f}" for h in r["history"])
        body.append([f"`{r['run']}`", r["label"], r.get("init_from"), r["lr"], r["steps"], f"{r['train_s'] / 60:.1f}"])
        body[-1] += [f"{r['tok_s']:.0f}", r["train_seqs"], curve]
    head = ["run", "what", "init from", "lr", "steps", "min", "block tok/s", "train seqs"]
    return table(head + ["held-out walk tau by labelled block tokens"], body)


# ---- micro-benchmarks -----------------------------------------------------------------------------
def micro_shape(r: dict) -> str:
    if r["op"] in ("rope_qk", "rms_norm"):
        return f"T={r['tokens']}"
    return f"D={r['head_dim']}" if "head_dim" in r else f"bs={r['batch']} B={r['block']}"


def micro() -> list[str]:
    out = ["### C++ ops against their torch references (`ops_cpu.jsonl`)", ""]
    for run, rs in runs(rows("ops_cpu")).items():
        body = [
            [r["op"], micro_shape(r)]
            + [r.get("dtype", "int64").replace("torch.", ""), f2(r["op_ms"]), f2(r["ref_ms"]), f"{r['speedup']:.1f}x"]
            for r in rs
        ]
        out += [f"`{run}`, {about(rs)}:", ""] + table(["op", "shape", "dtype", "C++ ms", "ref ms", "speedup"], body)
    out += ["", "### Draft stage by draft-head size (`draft_head.jsonl`)", ""]
    for run, rs in runs(rows("draft_head")).items():
        vocabs = sorted({r["draft_vocab"] for r in rs}, reverse=True)
        forms = list(dict.fromkeys((r["bs"], r.get("width"), r.get("fused"), r.get("cut"), r.get("int8")) for r in rs))
        body = []
        for form in forms:
            got = {
                r["draft_vocab"]: r
                for r in rs
                if (r["bs"], r.get("width"), r.get("fused"), r.get("cut"), r.get("int8")) == form
            }
            body.append([*form] + [f"{got[v]['draft_ms']} ({got[v]['head_ms']})" if v in got else None for v in vocabs])
        head = ["batch", "width", "fused", "row cut", "int8 head"] + [f"vocab {v}" for v in vocabs]
        flush = rs[0].get("flush_mb")
        flush = f"; {flush} MiB read between calls" if flush else ""
        out += [f"`{run}`, {about(rs)}{flush}; draft ms (head matmul ms):", ""] + table(head, body) + [""]
    out += ["### Target sampling stage, ms per call (`sampling_bench.jsonl`)", ""]
    for run, rs in runs(rows("sampling_bench")).items():
        body = [
            [f"{r['bs']} x {r['width']}", r["t1_ms"], r["t1_seeded_ms"], r["top_k50_ms"], r["top_p0.9_ms"]] for r in rs
        ]
        out += [f"`{run}`, {about(rs)}:", ""] + table(["batch x width", "T=1", "seeded", "top-k 50", "top-p 0.9"], body)
    out += ["", "### Drafter training step by loss (`train_step.jsonl`)", ""]
    for run, rs in runs(rows("train_step")).items():
        body = [
            [r["arm"], r["head_rows"], r["step_s"], f"{r['forward_s']} / {r['loss_s']} / {r['backward_s']}"] for r in rs
        ]
        for b, r in zip(body, rs):
            b.append(r["block_tok_s"])
        head = ["arm", "head rows", "step s", "forward / loss / backward s", "block tok/s"]
        out += [f"`{run}`, {about(rs)}:", ""] + table(head, body)
    out += ["", "### Torch attention paths, before and after batching (`attention_bench.jsonl`)", ""]
    for run, rs in runs(rows("attention_bench")).items():
        blocks = sorted({r["block"] for r in rs})
        body = []
        for op, dt, bs in dict.fromkeys((r["op"], r["dtype"], r["bs"]) for r in rs):
            got = {r["block"]: r for r in rs if (r["op"], r["dtype"], r["bs"]) == (op, dt, bs)}
            ms = [
                [f"{1e3 * got[b][k]:.3f}" for k in ("call_before_s", "call_after_s", "call_one_call_s")] for b in blocks
            ]
            body.append([op, dt, bs] + [" / ".join(m) for m in ms])
        head = ["op", "dtype", "batch"] + [f"block {b}: before / after / one padded call, ms" for b in blocks]
        out += [f"`{run}`, {about(rs)}; prefixes {rs[0]['prefix']}:", ""] + table(head, body)
    out += ["", "### Draft forward and RoPE lookup, before and after the cached table (`draft_rope.jsonl`)", ""]
    for run, rs in runs(rows("draft_rope")).items():
        body = []
        for code, dt, ctx in dict.fromkeys((r["label"].split("/")[0], r["dtype"], r["ctx"]) for r in rs):
            g = [r for r in rs if (r["label"].split("/")[0], r["dtype"], r["ctx"]) == (code, dt, ctx)]
            fw, rp = (sorted(r[k] for r in g) for k in ("forward_median_ms", "rope_median_ms"))
            body.append([code, dt, ctx, len(g), fw[len(fw) // 2], rp[len(rp) // 2]])
        head = ["code", "dtype", "context", "repeats", "forward ms (median)", "RoPE ms (median)"]
        out += [f"`{run}`, {about(rs)}:", ""] + table(head, body)
    return out


def scale_out() -> list[str]:
    """Layouts of the same cores side by side (bench/scale_out_bench.py): tok/s per concurrency."""
    out = []
    for run, rs in runs(rows("scale_out")).items():
        concs = sorted({r["concurrency"] for r in rs})
        cells = {(r["layout"], r["arm"], r["concurrency"]): r["tok_s"] for r in rs}
        keys = sorted({(r["layout"], r["arm"]) for r in rs})
        out += [f"Run `{run}` ({about(rs)}); output tok/s:", ""]
        body = [[lay, arm, *[f1(cells.get((lay, arm, c))) for c in concs]] for lay, arm in keys]
        out += table(["layout", "arm", *[f"c={c}" for c in concs]], body) + [""]
    return out


def step_profile() -> list[str]:
    """Where a served decode step's time goes (bench/step_profile.py): ms per step by stage."""
    out = []
    for run, rs in runs(rows("step_profile")).items():
        stages = list(dict.fromkeys(s for r in rs for s in r["stages_ms_per_step"]))
        cols = [f"{r['dtype']}{' ' + r['arm'] if r.get('arm') else ''} W={r['width']} c={r['concurrency']}" for r in rs]
        body = [[s, *[f1(r["stages_ms_per_step"].get(s, 0.0)) for r in rs]] for s in stages]
        body.append(["**step**", *[f"**{f1(r['ms_per_step'])}**" for r in rs]])
        if all("ms_per_step_unsampled" in r for r in rs):
            body.append(["step, no sampler running", *[f1(r["ms_per_step_unsampled"]) for r in rs]])
        out += [f"Run `{run}` ({about(rs)}); ms per decode step, pinned verify width W, concurrency c:", ""]
        out += table(["stage", *cols], body) + [""]
    return out


def graphs_bench() -> list[str]:
    """The draft stage per (batch, width) on CPU: eager, the step-graph twin, the compiled twin."""
    out = []
    for run, rs in runs(rows("graphs_bench")).items():
        get = lambda r, k: f2(r[k]) if k in r else "-"  # noqa: E731  (the compiled arm came later)
        body = [
            [r["bs"], r["width"], f2(r["eager_ms"]), f2(r["graphs_ms"]), get(r, "compiled_ms"), get(r, "compile_s")]
            for r in rs
        ]
        where = about(rs) + ", " if "commit" in rs[0] else ""
        out += [f"Run `{run}` ({where}context {rs[0]['ctx']}, {rs[0]['threads']} thread):", ""]
        out += table(["bs", "width", "eager ms", "eager twin ms", "compiled twin ms", "compile s"], body) + [""]
    return out
