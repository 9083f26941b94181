"""docs/results.md sections for the CPU step's own benches (results_page.py calls them): the target's
GEMMs (cpu_linear_bench.py) and its whole forward outside the server (layer_stack_bench.py)."""

from __future__ import annotations

from results_tables import about, f1, f2, rows, runs, table


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
