"""docs/results.md sections for the CPU step's own benches (results_page.py calls them): the target's
GEMMs (cpu_linear_bench.py) and its whole forward outside the server (layer_stack_bench.py)."""

from __future__ import annotations

from results_tables import about, f1, f2, rows, runs, spread, table


def cpu_linear() -> list[str]:
    """The target's GEMMs per step on CPU (bench/cpu_linear_bench.py): torch bf16, ours, oneDNN on
    packed weights (runs since it was measured), torch fp32."""
    out = []
    for run, rs in runs(rows("cpu_linear")).items():
        packed = all("packed_bf16_ms" in r for r in rs)
        body = [
            [str(r["rows"]), f1(r["torch_bf16_ms"]), f1(r["ours_bf16_ms"])]
            + ([f1(r["packed_bf16_ms"])] if packed else [])
            + [f1(r["torch_fp32_ms"]), f"{r['speedup_vs_torch_bf16']:.2f}x"]
            for r in rs
        ]
        head = ["rows", "torch bf16 ms", "ours bf16 ms"] + (["packed bf16 ms"] if packed else [])
        out += [f"Run `{run}` ({about(rs)}, {rs[0]['cpu_capability']}, {rs[0]['threads']} thread):", ""]
        out += table(head + ["torch fp32 ms", "ours vs torch bf16"], body) + [""]
    return out


def layer_stack() -> list[str]:
    """The target's forward per step outside the server, whole and by op, per arm (a kernel's
    before/after in one run: the arms alternate, one row per arm and repeat)."""
    parts = ("gemm", "norm", "rope", "kv_write", "attention", "act")
    out = []
    for run, rs in runs(rows("layer_stack")).items():
        r0 = rs[0]
        what = f"prefix {r0['prefix']}, {'scattered' if r0['scatter'] else 'contiguous'} slots, {r0['threads']} thread"
        out += [f"Run `{run}` ({about(rs)}; {what}; ms a step):", ""]
        body = [
            [r.get("arm", "now"), r.get("repeat", 0), r["bs"], r["rows"], f1(r["whole_ms"]), f1(r["sum_of_parts_ms"])]
            + [f2(r["parts_ms"][p]) for p in parts]
            for r in rs
        ]
        out += table(["arm", "repeat", "requests", "rows each", "whole", "sum of ops", *parts], body) + [""]
    return out


def equal_threads_table(rs: list[dict]) -> list[str]:
    """One peer_bench run (bench/peer_bench.py): ours beside llama.cpp at EQUAL threads, paired
    within a repeat; our default-thread arm beside, paired with llama.cpp on as many threads."""
    llama = {r["threads"]: r for r in rs if r["config"].startswith("llama.cpp")}
    body = []
    for r in rs:
        if r["config"].startswith("llama.cpp") or r.get("vs_llama_equal_threads") is None:
            continue
        peer = llama.get(r["threads"])
        default = "-t" not in r["config"]
        body.append(
            [r["threads"], f"{r['config']}{' (our default)' if default else ''}", spread(r, "tok_s")]
            + [spread(peer, "tok_s") if peer else None, spread(r, "vs_llama_equal_threads", f2, "x")]
        )
    body.sort(key=lambda b: (b[0], "(our default)" in b[1]))
    head = ["threads", "ours", "ours tok/s", "llama.cpp tok/s", "ours / llama.cpp (same threads, min-max)"]
    return table(head, body)


def peer_equal_threads() -> list[str]:
    """docs/results.md: the equal-threads table of each peer_bench run that has one, with the
    llama.cpp build it measured."""
    out = []
    for run, rs in runs(rows("peer_bench")).items():
        if not any(r.get("vs_llama_equal_threads") is not None for r in rs):
            continue
        b = next((r["llama_build"] for r in rs if r.get("llama_build")), {})
        info = next((r["llama_system_info"] for r in rs if r.get("llama_system_info")), None)
        what = f"llama-cpp-python {b.get('llama_cpp_python')}, CMAKE_ARGS `{b.get('cmake_args')}`"
        out += [f"Run `{run}`, equal threads ({what}; llama.cpp reports `{info}`):", ""]
        out += equal_threads_table(rs) + [""]
    return out
