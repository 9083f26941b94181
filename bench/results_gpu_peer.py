"""docs/results.md sections for the device check and the peer comparison (results_page.py calls them)."""

from __future__ import annotations

from results_tables import about, f1, f2, rows, runs, table


def gpu_check() -> list[str]:
    """Kernels tier of bench/checks/gpu_check.sh on a GPU: every check, its error and timing."""
    out = []
    for run, rs in runs(rows("gpu_check_kernels")).items():
        r = rs[0]
        out += [f"Run `{run}` ({about(rs)}; {r['gpu']}, torch {r['torch']}; {r.get('note', '')}):", ""]
        body = []
        for c in r["results"]:
            what = " ".join(
                str(c[k])
                for k in ("layout", "kv_dtype", "order", "head_dim", "cache_dtype", "batch", "context")
                if k in c
            )
            err = next((c[k] for k in ("rel_err", "max_err", "max_tv") if k in c), None)
            body.append([c["op"], what, "ok" if c["ok"] else "**FAIL**", f2(err) if err else err, f2(c.get("op_ms")), f1(c.get("speedup"))])  # fmt: skip
        out += table(["check", "case", "result", "error", "op ms", "x torch ref"], body) + [""]
    return out


def peer() -> list[str]:
    """bench/peer_bench.py: our servers beside llama.cpp at concurrency 1, tok/s and ratio."""
    out = []
    for run, rs in runs(rows("peer_bench")).items():
        base = next(k[3:] for k in rs[0] if k.startswith("vs_") and not k.endswith(("_min", "_max", "_stdev", "_runs")))
        body = [[r["config"], f"{f1(r['tok_s'])} ({f1(r['tok_s_min'])}-{f1(r['tok_s_max'])})", f1(r["ms_per_token"]), f"{f2(r['vs_' + base])}x"] for r in rs]  # fmt: skip
        n = rs[0]
        out += [f"Run `{run}` ({about(rs)}); {n['requests']} held-out prompts, {n['max_new_tokens']} new tokens each, concurrency 1, greedy, {n.get('method', '')}:", ""]  # fmt: skip
        out += table(["arm", "tok/s (min-max)", "ms/token", f"vs {base}"], body) + [""]
    return out


def datagen() -> list[str]:
    """Training-data generation, plain vs through DFLASH, side by side (bench/drafter_levers.sh)."""
    out = []
    for run, rs in runs(rows("datagen")).items():
        plain = next((r["tok_s"] for r in rs if r["arm"] == "plain"), None)
        out += [f"Run `{run}` ({about(rs)}); {rs[0]['setup']}:", ""]
        body = [[r["arm"], r["prompts"], r["answer_tokens"], f1(r["wall_s"]), f1(r["tok_s"]), f"{f2(r['tok_s'] / plain)}x" if plain else None] for r in rs]  # fmt: skip
        out += table(["datagen", "prompts", "answer tokens", "s", "answer tok/s", "vs plain"], body) + [""]
    return out
