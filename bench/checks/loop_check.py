"""The loop tier of the GPU check (gpu_check.sh), SGLang-free: for each target preset (hf_target.py,
random weights, float32) and a random steered DFlash drafter (spec_loop.py):
  1. `loop` rows: speculative greedy decoding of a few batches (a bucket edge, a padded batch, one
     request), the verify width changing every step, against the target's own greedy decoding:
     token-identical, every draft step replayed from the step graphs, no draft failure; tau;
  2. `shape` rows: every (bucket, width) draft shape captured and replayed, its replay equal to the
     eager step, eager vs replayed step time;
  3. a `summary` row per preset: the graph counts, shapes held, peak device memory.
Rows go to DIR/loop_check.jsonl (DIR/loop_check_cpu.jsonl for --dry-run); exit 0 when every row is ok.
--dry-run: the CPU twin (tiny 2-layer targets, graphs `eager`, torch attention), what CI runs."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, ROOT, os.path.join(ROOT, "bench")]  # hf_target / spec_loop, the package, provenance
import provenance  # noqa: E402  (bench/provenance.py)
import spec_loop  # noqa: E402
from hf_target import Target  # noqa: E402
from sglang_dflash import kernels  # noqa: E402
from sglang_dflash.testing.tiny_drafter import STEER_TOKEN  # noqa: E402

# SGLang's default decode capture list (srt/graph_choice.DEFAULT_BUCKETS, restated: no srt import here).
GPU_BUCKETS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
# preset -> the drafter's (heads, kv_heads, head_dim, layers): head dims whose FlashInfer modules the
# kernels tier has already built (9/3/64 and 32/8/128 bf16).
DRAFTERS = {"llama-tiny": (4, 2, 16, 2), "qwen3-tiny": (4, 2, 16, 2),
            "llama-smollm2-135m": (9, 3, 64, 2), "qwen3-0.6b": (32, 8, 128, 2)}  # fmt: skip
PLANS = {
    # block, buckets, sweep widths, the loop's width cycle, loop batch sizes, new tokens, prompt lengths, reps
    "dry": dict(block=8, buckets=[1, 2, 4], widths=[2, 5, 8], cycle=[8, 2, 5, 3, 7], batches=[1, 3, 5],
                max_new=24, prompt=(3, 10), reps=2, presets=["llama-tiny", "qwen3-tiny"]),
    "gpu": dict(block=16, buckets=GPU_BUCKETS, widths=list(range(2, 17)),
                cycle=[16, 2, 9, 4, 13, 6, 11, 3, 15, 8, 5, 12, 7, 14, 10], batches=[1, 5, 16], max_new=48,
                prompt=(4, 24), reps=5, presets=["llama-smollm2-135m", "qwen3-0.6b"]),
}  # fmt: skip


QUIET = ("got", "want", "dirty_files", "host")  # in the rows, not printed


def peak_mib(dev: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if dev == "cuda" else None


def reset_peak(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def loop_row(d, plan: dict, bs: int, g: torch.Generator) -> dict:
    """Speculative decoding of bs random prompts against the target's own greedy decoding."""
    t = d.target
    lo, hi = plan["prompt"]
    prompts = [torch.randint(3, t.vocab - 1, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()
               for _ in range(bs)]  # fmt: skip
    before = dict(d.graphs.counts)
    t0 = time.perf_counter()
    got = spec_loop.decode(d, prompts, plan["max_new"], plan["cycle"])
    spec_s = time.perf_counter() - t0
    want = [t.greedy(p, plan["max_new"]) for p in prompts]
    first_diff = next((i for i, (a, b) in enumerate(zip(got["outputs"], want)) if a != b), None)
    counts = {k: v - before.get(k, 0) for k, v in d.graphs.counts.items() if v - before.get(k, 0)}
    above_ok = "fallback:batch above the largest bucket"  # a batch above every bucket runs eagerly by design
    fallbacks = {k: v for k, v in counts.items() if k.startswith("fallback") and k != above_ok}
    identical = first_diff is None
    tokens = sum(got["outputs"], [])
    row = dict(check="loop", bs=bs, tokens=len(tokens), steer_token_share=tokens.count(STEER_TOKEN) / len(tokens),
               identical=identical,
               steps=got["steps"], tau=sum(map(len, got["outputs"])) / got["request_steps"],
               accepted=got["accepted"], draft_failed=got["draft_failed"], graphs=counts, spec_s=spec_s)  # fmt: skip
    if not identical:
        row.update(request=first_diff, got=got["outputs"][first_diff], want=want[first_diff])
    # Every step whose batch fits a bucket replays (the eager twin on CPU counts the same way).
    above = bs > max(plan["buckets"])
    row["ok"] = identical and not got["draft_failed"] and not fallbacks and (above or counts.get("replayed", 0) > 0)
    return row


def setup(name: str, plan: dict, dev: str, g: torch.Generator):
    """The preset's target (steered) and drafting side -> (Drafting, the rows' common fields, summary fields)."""
    t = Target(name, dev)
    lo, hi = plan["prompt"]
    max_len = hi + plan["max_new"] + plan["block"]
    rows_needed = max(plan["batches"] + plan["buckets"])
    steer_prompts = [torch.randint(3, t.vocab - 1, (hi,), generator=g).tolist() for _ in range(3)]
    strength, share = t.steer(steer_prompts, plan["max_new"])
    d = spec_loop.Drafting(t, DRAFTERS[name], plan["block"], max_len, rows_needed, plan["buckets"])
    base = dict(preset=name, device=dev, attention="flashinfer" if d.flashinfer else "torch", graphs_mode=d.graphs_mode)
    info = dict(target_layers=t.num_layers, hidden=t.config.hidden_size, vocab=t.vocab, drafter=DRAFTERS[name],
                block=plan["block"], steer_strength=strength, steer_share=share)  # fmt: skip
    return d, base, info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the folder the JSONL rows go to")
    ap.add_argument("--dry-run", action="store_true", help="the CPU twin: tiny targets, graphs eager, torch attention")
    ap.add_argument("--presets", nargs="*", help="target presets (hf_target.PRESETS); default: the plan's")
    ap.add_argument("--budget-s", type=float, default=420.0, help="work past this many seconds is skipped (not ok)")
    a = ap.parse_args()
    start = time.time()
    deadline = start + a.budget_s
    dev = "cpu" if a.dry_run else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("loop_check: no CUDA device (use --dry-run for the CPU twin)", file=sys.stderr)
        return 2
    plan = PLANS["dry" if a.dry_run else "gpu"]
    kernels.load()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "loop_check_cpu.jsonl" if a.dry_run else "loop_check.jsonl")
    out, rows = open(path, "w"), []

    def emit(r: dict) -> dict:  # row by row, so a run cut by its timeout still leaves what it did
        rows.append(r)
        out.write(json.dumps(r) + "\n")
        out.flush()
        if r["check"] != "shape" or not r["ok"]:
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k not in QUIET})
        return r

    g = torch.Generator().manual_seed(0)
    presets = []
    for name in a.presets or plan["presets"]:  # 1) every preset's loops first: token identity matters most
        if time.time() > deadline:
            emit(dict(preset=name, device=dev, check="loop", ok=False, skipped="out of time"))
            continue
        reset_peak(dev)
        t0 = time.perf_counter()
        d, base, info = setup(name, plan, dev, g)
        mine = [emit(dict(base, **loop_row(d, plan, bs, g))) for bs in plan["batches"]]
        presets.append((d, base, info, mine, peak_mib(dev), time.perf_counter() - t0))
    stamp = dict(provenance.stamp(), torch=torch.__version__, backend=kernels.load(),
                 gpu=torch.cuda.get_device_name() if dev == "cuda" else platform.processor())  # fmt: skip
    for d, base, info, mine, loop_peak, loop_s in presets:  # 2) every (bucket, width) draft shape
        reset_peak(dev)
        t0 = time.perf_counter()
        for bucket in plan["buckets"]:
            for width in plan["widths"]:
                if time.time() > deadline:
                    r = dict(base, check="shape", bs=bucket, width=width, ok=False, skipped="out of time")
                else:
                    r = dict(base, check="shape", **spec_loop.sweep_shape(d, bucket, width, plan["reps"], g))
                mine.append(emit(r))
        held = sum(1 for r in mine if r.get("held"))
        shapes = sum(1 for r in mine if r["check"] == "shape")
        summary = dict(base, check="summary", **info, counts=dict(d.graphs.counts), shapes=shapes, shapes_held=held,
                       loop_peak_mib=loop_peak, sweep_peak_mib=peak_mib(dev), loop_s=loop_s,
                       sweep_s=time.perf_counter() - t0, **stamp)  # fmt: skip
        summary["ok"] = all(r["ok"] for r in mine) and held == shapes
        emit(summary)
    out.close()
    ok = all(r["ok"] for r in rows)
    print(f"gpu_check loop: {'PASS' if ok else 'FAIL'} ({len(rows)} rows, {time.time() - start:.0f} s) -> {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
