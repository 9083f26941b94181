"""CPU GEMMs of the embedded SmolLM2-135M target, side by side in one run: torch bf16 (what SGLang
runs), our bf16_linear (csrc/cpu/bf16_linear_cpu.cpp, bf16 weights widened to fp32 in registers), oneDNN
on weights packed once (csrc/cpu/packed_linear_cpu.cpp: what the DFLASH worker runs past bf16_linear's
rows where it packs) and torch fp32 (fp32 weights), at the row counts of a decode step (1) and of
verify steps (2..64 rows).
The shapes are SGLang's fused layers (qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576)
and the LM head (576->49152); one "step" is 30 layers of the four plus the head.

python bench/cpu_linear_bench.py [--rows 1 2 4 8 16 32 64] [--threads 1]
Appends to bench/results/cpu_linear.jsonl (ms per step and GFLOP/s per arm, ratios to torch bf16)
and draws bench/results/cpu_linear.png.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench"), os.path.join(ROOT, "bench", "checks")]
import provenance  # noqa: E402
from gpu_check import timeit  # noqa: E402  (the timing code of every bench here)
from sglang_dflash import kernels  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "cpu_linear.jsonl")
LAYERS = 30
SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576), "lm_head": (576, 49152)}


def weights(dtype):
    """One weight per layer and shape, as in the model: 270 MB of bf16 that no cache holds, so a
    one-row step streams them from memory as a served step does (one matrix timed in a loop would
    sit in L2/L3 and measure a cache-resident GEMV instead)."""
    g = torch.Generator().manual_seed(0)
    return {
        name: [
            (torch.randn(n, k, generator=g) / k**0.5).bfloat16().to(dtype)
            for _ in range(1 if name == "lm_head" else LAYERS)
        ]
        for name, (k, n) in SHAPES.items()
    }


def step_ms(rows: int, arm: str, ws: dict) -> dict:
    ops, per = kernels.ops(), {}
    for name, (k, n) in SHAPES.items():
        x = torch.randn(rows, k).bfloat16()
        if arm == "torch_bf16":
            fn = lambda: [torch.nn.functional.linear(x, w) for w in ws[name]]  # noqa: E731
        elif arm == "ours_bf16":
            fn = lambda: [ops.bf16_linear(x, w, None) for w in ws[name]]  # noqa: E731
        elif arm == "packed_bf16":
            fn = lambda: [ops.packed_linear(x, w, None) for w in ws[name]]  # noqa: E731
        else:
            xf = x.float()
            fn = lambda: [torch.nn.functional.linear(xf, w) for w in ws[name]]  # noqa: E731
        per[name] = timeit(fn, "cpu", reps=5) * 1e3
    return per


def ops_pack(w, rows: int) -> bool:
    return bool(kernels.ops().pack_linear(w, rows))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert kernels.load() == "extension", "build the extension first (make install)"
    prov = provenance.stamp()
    flops_per_row = 2 * sum(k * n * (1 if s == "lm_head" else LAYERS) for s, (k, n) in SHAPES.items())
    rows_out, w16 = [], weights(torch.bfloat16)
    w32 = {k: [w.float() for w in v] for k, v in w16.items()}
    packed = all(ops_pack(w, 64) for ws in w16.values() for w in ws)
    print(f"| rows | torch bf16 ms | ours bf16 ms | packed bf16 ms (packed: {packed}) | torch fp32 ms | "
          "ours / torch bf16 | ours GFLOP/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    names = ("torch_bf16", "ours_bf16", "packed_bf16", "torch_fp32")
    for m in args.rows:
        arms = {a: step_ms(m, a, w32 if a == "torch_fp32" else w16) for a in names}
        total = {a: sum(v.values()) for a, v in arms.items()}
        gflops = flops_per_row * m / (total["ours_bf16"] / 1e3) / 1e9
        rows_out.append(
            {
                "rows": m,
                "threads": args.threads,
                **{f"{a}_ms": round(t, 3) for a, t in total.items()},
                "by_layer_ms": {a: {k: round(t, 3) for k, t in v.items()} for a, v in arms.items()},
                "speedup_vs_torch_bf16": round(total["torch_bf16"] / total["ours_bf16"], 2),
                "ours_gflops": round(gflops, 1),
                "packed": packed,
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                **{k: prov[k] for k in ("commit", "dirty", "time", "host")},
            }
        )
        print(
            f"| {m} | {total['torch_bf16']:.1f} | {total['ours_bf16']:.1f} | {total['packed_bf16']:.1f} | "
            f"{total['torch_fp32']:.1f} | "
            f"{total['torch_bf16'] / total['ours_bf16']:.2f}x | {gflops:.1f} |",
            flush=True,
        )
    provenance.append_rows(OUT, rows_out, prov)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["rows"] for r in rows_out]
    for a in names:
        plt.plot(xs, [r[f"{a}_ms"] for r in rows_out], marker="o", label=a)
    plt.xscale("log", base=2)
    plt.yscale("log")
    plt.xlabel("rows per GEMM (batch x verify width)")
    plt.ylabel("ms per step (30 layers + LM head)")
    plt.title(f"SmolLM2-135M GEMMs on CPU ({torch.backends.cpu.get_cpu_capability()}, {args.threads} thread)")
    plt.legend()
    plt.grid(alpha=0.3)
    plt.savefig(OUT.replace(".jsonl", ".png"), dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()
