"""CPU microbenchmark: each csrc/ op against its torch reference (5 drafter layers, 2048 tokens,
head_dim 64 and 128), measured side by side in one run. Writes bench/results/ops_cpu.jsonl and
prints the README table. Every row carries the commit measured and a dirty flag (bench/provenance.py)."""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import provenance  # noqa: E402
from gpu_check import check_accept, check_write  # noqa: E402


def main(out="bench/results/ops_cpu.jsonl"):
    prov = provenance.stamp()  # before the run rewrites its own result file
    rows = [check_write("cpu", D, dt) for D in (64, 128) for dt in (torch.float32, torch.bfloat16)]
    rows.append(check_accept("cpu"))
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps({**r, **{k: prov[k] for k in ("commit", "dirty", "dirty_files", "time")}}) + "\n")
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
