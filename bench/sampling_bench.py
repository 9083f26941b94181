"""The target-sampling stage alone (pipeline/target_sampling.target_tokens) at the verify shapes a
decode step hands it: batch x width rows of the embedded model's vocabulary (49,152), bf16 logits,
temperature 1 with no filter, seeded, top-k 50 and top-p 0.9. Appends one run to
bench/results/sampling_bench.jsonl.

    python bench/sampling_bench.py
"""

from __future__ import annotations

import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import provenance  # noqa: E402
from sglang_dflash.pipeline.target_sampling import SamplingRows, target_tokens  # noqa: E402

VOCAB = 49152
SHAPES = [(1, 1), (1, 4), (1, 16), (16, 1), (16, 2), (16, 4), (16, 16), (32, 2)]
CASES = {
    "t1": dict(top_k=-1, top_p=1.0, seeded=False),
    "t1_seeded": dict(top_k=-1, top_p=1.0, seeded=True),
    "top_k50": dict(top_k=50, top_p=1.0, seeded=False),
    "top_p0.9": dict(top_k=-1, top_p=0.9, seeded=False),
}


def peaked_logits(rows: int, gen: torch.Generator) -> torch.Tensor:
    """Language-model-like rows: a few likely tokens over a long tail."""
    logits = torch.randn(rows, VOCAB, generator=gen) * 2
    top = torch.randint(0, VOCAB, (rows, 8), generator=gen)
    logits.scatter_(1, top, torch.randn(rows, 8, generator=gen) + 10)
    return logits.to(torch.bfloat16)


def time_case(bs: int, width: int, top_k: int, top_p: float, seeded: bool, reps: int = 5) -> float:
    logits = peaked_logits(bs * width, torch.Generator().manual_seed(0))
    full = lambda x: torch.full((bs,), x)  # noqa: E731
    rows = SamplingRows(
        full(1.0), full(top_p), full(top_k), full(0.0), [i if seeded else None for i in range(bs)], [7] * bs
    )
    target_tokens(logits, width, rows)
    start = time.perf_counter()
    for _ in range(reps):
        target_tokens(logits, width, rows)
    return (time.perf_counter() - start) / reps


def main() -> None:
    torch.set_num_threads(1)
    prov = provenance.stamp()
    out = os.path.join(ROOT, "bench", "results", "sampling_bench.jsonl")
    rows = []
    for bs, width in SHAPES:
        row = {"bs": bs, "width": width, "rows": bs * width, "vocab": VOCAB}
        for name, case in CASES.items():
            row[f"{name}_ms"] = round(time_case(bs, width, **case) * 1e3, 3)
        print(row)
        rows.append({**row, **prov})
    provenance.append_rows(out, rows, prov)


if __name__ == "__main__":
    main()
