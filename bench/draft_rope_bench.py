"""CPU timing of one draft forward (the drafter's block forward as draft.propose runs it, context K/V
of the given length in the paged draft KV) and of its RoPE lookup alone, for the shipped drafter.

Run once per code version and repeat, alternating; rows of that label in the results file are replaced:
    OMP_NUM_THREADS=1 SGLANG_USE_CPU_ENGINE=1 python bench/draft_rope_bench.py --label after/1
(`before/N`: the same command, run outside the repo with PYTHONPATH at a copy of the tree before the
change), then `--summary` prints the before/after table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import provenance  # noqa: E402

import sglang_dflash  # noqa: E402
from sglang_dflash.pipeline.attention import TorchBlockAttention  # noqa: E402
from sglang_dflash.model.config import load_drafter_config  # noqa: E402
from sglang_dflash.pipeline.context_kv import DraftKVCache  # noqa: E402
from sglang_dflash.model.drafter import rope_cos_sin  # noqa: E402
from sglang_dflash.model.loader import load_drafter  # noqa: E402

DRAFTER = os.path.join(os.path.dirname(sglang_dflash.__file__), "drafters", "smollm2-135m-instruct-dflash")
TARGET_LAYERS = 30  # SmolLM2-135M; only used to resolve default layer ids, the config names its own


def median_ms(fn, runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def measure(ctx: int, dtype: torch.dtype, runs: int) -> dict:
    cfg = load_drafter_config(DRAFTER, TARGET_LAYERS)
    drafter = load_drafter(DRAFTER, cfg, dtype, "cpu").eval()
    B = cfg.block_size
    torch.manual_seed(0)
    cache = DraftKVCache(cfg.num_layers, ctx + B, cfg.num_kv_heads, cfg.head_dim, dtype, "cpu")
    cache.k.normal_()
    cache.v.normal_()
    slots = torch.arange(ctx + B)  # one request: context rows 0..ctx-1, then the block's rows
    # the shipped drafter has full-attention layers only, so no windows (the old code took none)
    attend = TorchBlockAttention(cache.k, cache.v, [slots], slots[ctx:], cfg.head_dim**-0.5)
    x = torch.randn(B, cfg.hidden_size, dtype=dtype)  # [B, H] embedded block
    positions = torch.arange(ctx, ctx + B)  # [B]
    fwd = median_ms(lambda: drafter(x, positions, attend, B), runs)
    rope = median_ms(lambda: rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta), runs)
    return {
        "ctx": ctx,
        "dtype": str(dtype).replace("torch.", ""),
        "block": B,
        "layers": cfg.num_layers,
        "hidden": cfg.hidden_size,
        "runs": runs,
        "forward_median_ms": round(fwd, 3),
        "rope_median_ms": round(rope, 4),
    }


def summary(path: str) -> None:
    """Before vs after: per (ctx, dtype), the median over repeats (labels `before/N`, `after/N`) of
    each repeat's median. Repeats alternate before/after so drift on a shared machine hits both."""
    with open(path) as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    arms: dict = {}
    for r in rows:
        arms.setdefault((r["ctx"], r["dtype"], r["label"].split("/")[0]), []).append(r)
    print("| ctx | dtype | forward ms before | after | rope ms before | after | repeats |")
    print("|---|---|---|---|---|---|---|")
    for ctx, dt in sorted({(r["ctx"], r["dtype"]) for r in rows}):
        b, a = arms.get((ctx, dt, "before"), []), arms.get((ctx, dt, "after"), [])
        med = lambda rs, k: statistics.median(r[k] for r in rs) if rs else float("nan")  # noqa: E731
        print(
            f"| {ctx} | {dt} | {med(b, 'forward_median_ms'):.2f} | {med(a, 'forward_median_ms'):.2f} | "
            f"{med(b, 'rope_median_ms'):.4f} | {med(a, 'rope_median_ms'):.4f} | {len(b)}+{len(a)} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", help="which code ran and which repeat: before/1, after/1, ...")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", default="bench/results/draft_rope.jsonl")
    ap.add_argument("--summary", action="store_true", help="print the before/after table of --out and exit")
    args = ap.parse_args()
    if args.summary or not args.label:
        return summary(args.out)
    prov = provenance.stamp()
    keep = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            keep = [ln for ln in f if ln.strip() and json.loads(ln)["label"] != args.label]
    rows = [measure(ctx, dt, args.runs) for ctx in (512, 8192) for dt in (torch.bfloat16, torch.float32)]
    extra = {
        "label": args.label,
        "code": os.path.dirname(sglang_dflash.__file__),
        "threads": torch.get_num_threads(),
        **{k: prov[k] for k in ("commit", "dirty", "time")},
    }
    with open(args.out, "w") as f:
        f.writelines(keep)
        for r in rows:
            f.write(json.dumps({**extra, **r}) + "\n")
    print(f"{args.label} ({extra['code']})\n| ctx | dtype | forward ms | rope ms |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['ctx']} | {r['dtype']} | {r['forward_median_ms']:.3f} | {r['rope_median_ms']:.4f} |")


if __name__ == "__main__":
    main()
