"""CPU microbenchmark: each csrc/ op against its torch reference (5 drafter layers, 2048 tokens,
head_dim 64 and 128), measured side by side in one run (the timing code is the GPU check's,
bench/checks/gpu_check.py). Appends one run to bench/results/ops_cpu.jsonl and prints its table."""

from __future__ import annotations

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "bench"), os.path.join(ROOT, "bench", "checks")]
import provenance  # noqa: E402
from gpu_check import check_accept, check_write  # noqa: E402


OUT = os.path.join(ROOT, "bench", "results", "ops_cpu.jsonl")


def main(out=OUT):
    prov = provenance.stamp()  # before the run writes its result rows
    rows = [check_write("cpu", D, dt) for D in (64, 128) for dt in (torch.float32, torch.bfloat16)]
    rows.append(check_accept("cpu"))
    keep = ("commit", "dirty", "dirty_files", "time", "host")
    provenance.append_rows(out, [{**r, **{k: prov[k] for k in keep}} for r in rows], prov)
    print("| op | shape | dtype | C++ ms | torch ref ms | speedup |\n|---|---|---|---|---|---|")
    for r in rows:
        shape = f"L=5 T=2048 D={r['head_dim']}" if "head_dim" in r else f"bs={r['batch']} B={r['block']}"
        print(
            f"| {r['op']} | {shape} | {r.get('dtype', 'int64').replace('torch.', '')} | {r['op_ms']:.2f} | "
            f"{r['ref_ms']:.2f} | {r['speedup']:.1f}x |"
        )
    assert all(r["ok"] for r in rows)


if __name__ == "__main__":
    main()
