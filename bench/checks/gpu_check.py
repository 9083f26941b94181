"""One-shot device check (driven by gpu_check.sh). Tier `kernels` needs only torch (+ FlashInfer on
GPU), not SGLang: which backend serves the ops (the compiled extension, with CUDA kernels on GPU, or
the check fails), the ops against their torch references (write_draft_kv: the whole K and V caches,
a random k_norm weight; fp32/bf16/fp16 caches and fp8 with a scale; head_dim 64/128, and 256 on GPU),
the drafter's batched non-causal block attention against an SDPA reference (head layouts 9/3/64,
32/8/128, 16/8/256; bf16/fp16/fp8 caches on GPU; error relative to the output's scale), and timings
of each against its reference, FlashInfer's plan() included; on GPU, our sampling filter against FlashInfer's
sampling kernels in the order SGLang calls them (sampling_check.py).
Writes one JSON report."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
sys.path.insert(1, os.path.join(sys.path[0], "bench"))
import provenance  # noqa: E402  (bench/provenance.py)
from sglang_dflash import kernels  # noqa: E402
from sglang_dflash.pipeline.attention import TorchBlockAttention, attend_rows  # noqa: E402
from sglang_dflash.kernels.reference import (
    linear_verify_accept_ref,
    rope_cos_sin_cache,  # noqa: E402
    write_draft_kv_ref,
)

from sampling_check import check_sampling_order  # noqa: E402  (bench/checks/sampling_check.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def timeit(fn, dev, reps=20):
    fn()
    if dev == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    if dev == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def cache_err(got, want):
    """Max |got - want| / (1 + |want|): one rounding flip of a bf16 value of magnitude m costs about
    m / 128, so an absolute bound would fail on large (weight-scaled) entries and hide small ones."""
    got, want = got.float(), want.float()
    return ((got - want).abs() / (1 + want.abs())).max().item()


def check_write(dev, D, dtype, L=5, T=2048, H=8, cache_dtype=None, kv_scale=1.0):
    g = torch.Generator().manual_seed(0)
    S = 4 * T
    k, v = (torch.randn(L, T, H, D, generator=g).to(dev, dtype) for _ in range(2))
    # A random, per-layer k_norm weight: all-ones would hide a kernel that skips the weight or
    # applies the wrong layer's row.
    w = (0.25 + 1.75 * torch.rand(L, D, generator=g)).to(dev, dtype)
    cs = rope_cos_sin_cache(8192, D, 1e6, dev)
    pos = torch.randint(0, 8192, (T,), generator=g).to(dev)
    slots = torch.randperm(S, generator=g)[:T].to(dev)
    # Caches start as the same junk (not zeros), so a kernel that writes a wrong slot or clobbers
    # an untouched one differs from the reference somewhere in the full-cache comparison.
    kc, vc = (torch.randn(L, S, H, D, generator=g).to(dev, cache_dtype or dtype) for _ in range(2))
    kr, vr = kc.clone(), vc.clone()
    op = kernels.ops().write_draft_kv
    op(k, v, w, cs, pos, slots, kc, vc, 1e-6, True, kv_scale)
    write_draft_kv_ref(k, v, w, cs, pos, slots, kr, vr, 1e-6, True, kv_scale=kv_scale)
    k_err, v_err = cache_err(kc, kr), cache_err(vc, vr)
    t_op = timeit(lambda: op(k, v, w, cs, pos, slots, kc, vc, 1e-6, True, kv_scale), dev)
    t_ref = timeit(lambda: write_draft_kv_ref(k, v, w, cs, pos, slots, kr, vr, 1e-6, True, kv_scale=kv_scale), dev)
    # fp8 e4m3 keeps 3 mantissa bits: one rounding flip of m costs m / 8, i.e. < 1/8 in cache_err.
    tol = 1e-4 if dtype == torch.float32 and cache_dtype is None else 2e-2 if cache_dtype is None else 0.13
    return {
        "op": "write_draft_kv",
        "device": dev,
        "head_dim": D,
        "dtype": str(dtype),
        "cache_dtype": str(cache_dtype or dtype),
        "layers": L,
        "tokens": T,
        "k_err": k_err,
        "v_err": v_err,
        "max_err": max(k_err, v_err),
        "ok": k_err < tol and v_err < tol,
        "op_ms": t_op * 1e3,
        "ref_ms": t_ref * 1e3,
        "speedup": t_ref / t_op,
    }


def check_accept(dev, bs=256, B=16):
    g = torch.Generator().manual_seed(1)
    target = torch.randint(0, 8, (bs, B), generator=g).to(dev)
    draft = torch.where(torch.rand(bs, B, generator=g).to(dev) < 0.8, target.roll(1, 1), target)
    prefix, budget = torch.full((bs,), 100, device=dev), torch.randint(1, 20, (bs,), generator=g).to(dev)
    stops = torch.randint(-1, 8, (bs, 2), generator=g).to(dev)
    op = kernels.ops().linear_verify_accept
    ok = all(
        torch.equal(a, b)
        for a, b in zip(
            op(draft, target, prefix, budget, stops), linear_verify_accept_ref(draft, target, prefix, budget, stops)
        )
    )
    t_op = timeit(lambda: op(draft, target, prefix, budget, stops), dev)
    t_ref = timeit(lambda: linear_verify_accept_ref(draft, target, prefix, budget, stops), dev)
    return {
        "op": "linear_verify_accept",
        "device": dev,
        "batch": bs,
        "block": B,
        "ok": ok,
        "op_ms": t_op * 1e3,
        "ref_ms": t_ref * 1e3,
        "speedup": t_ref / t_op,
    }


# Drafter head layouts (query heads, KV heads, head_dim): the shipped SmolLM2 drafter's, a Qwen3-8B
# drafter's, and a head_dim-256 one. Cache dtypes on GPU; each (head_dim, dtype) pair is one FlashInfer
# JIT module on a machine without prebuilt kernels, so the sweep keeps to five of them.
LAYOUTS = {"smollm2": (9, 3, 64), "qwen3-8b": (32, 8, 128), "hd256": (16, 8, 256)}
GPU_CASES = [("smollm2", torch.bfloat16), ("qwen3-8b", torch.bfloat16), ("qwen3-8b", torch.float16)]
GPU_CASES += [("qwen3-8b", torch.float8_e4m3fn), ("hd256", torch.bfloat16)]
# Max |out - ref| / max |ref|: the output's own scale (random V averages down as context grows, so an
# absolute bound loose enough for bf16 at short context hides everything at long context).
REL_TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float8_e4m3fn: 2e-2}


def block_case(dev, bs, ctx, heads, kv_dtype, B=16, seed=2):
    """Random draft KV pages, per-request prefixes (ctx, ctx - 7, ..., at least 1) and a block."""
    H, Hkv, D = heads
    g = torch.Generator().manual_seed(seed)
    S = bs * (ctx + B) * 2
    kc, vc = (torch.randn(1, S, Hkv, D, generator=g).to(dev, kv_dtype) for _ in range(2))
    perm = torch.randperm(S, generator=g).to(dev)
    prefix = torch.tensor([max(1, ctx - 7 * i) for i in range(bs)], device=dev)
    req_to_token = torch.zeros(bs, ctx + B, dtype=torch.int32, device=dev)
    off = 0
    for i, p in enumerate(prefix.tolist()):
        req_to_token[i, : p + B] = perm[off : off + p + B].to(torch.int32)
        off += p + B
    cols = torch.arange(B, device=dev)
    block_slots = req_to_token[torch.arange(bs, device=dev)[:, None], prefix[:, None] + cols].reshape(-1).long()
    q_dtype = torch.bfloat16 if kv_dtype.itemsize == 1 else kv_dtype
    q = torch.randn(bs * B, H, D, generator=g).to(dev, q_dtype)
    kb, vb = (torch.randn(bs * B, Hkv, D, generator=g).to(dev, q_dtype) for _ in range(2))
    kv_slots = [req_to_token[i, : p + B].long() for i, p in enumerate(prefix.tolist())]
    return kc, vc, req_to_token, prefix, block_slots, q, kb, vb, kv_slots


def block_attention(dev, case, B, H, D):
    """The drafter's block attention for this device: FlashInfer on GPU (planned here), torch on CPU."""
    kc, vc, req_to_token, prefix, block_slots, q, kb, vb, kv_slots = case
    if dev == "cuda":
        from sglang_dflash.pipeline.flashinfer_attention import FlashInferBlockAttention

        rows = torch.arange(len(kv_slots), device=dev)
        return FlashInferBlockAttention(kc, vc, req_to_token, rows, prefix, block_slots, B, H, D**-0.5)
    return TorchBlockAttention(kc, vc, kv_slots, block_slots, D**-0.5)


def check_block_attention(dev, bs, ctx, layout="qwen3-8b", kv_dtype=torch.bfloat16, B=16, reps=10):
    """Batched non-causal block attention vs per-request SDPA in float32 over the same (rounded) K/V."""
    H, Hkv, D = LAYOUTS[layout]
    case = block_case(dev, bs, ctx, (H, Hkv, D), kv_dtype, B)
    kc, vc, _, _, _, q, kb, vb, kv_slots = case
    attn = block_attention(dev, case, B, H, D)
    out = attn(0, q, kb, vb).float()
    ref = torch.cat(
        [
            attend_rows(q[i * B : (i + 1) * B].float(), kc[0][s].float(), vc[0][s].float(), D**-0.5)
            for i, s in enumerate(kv_slots)
        ]
    )
    rel_err = ((out - ref).abs().max() / ref.abs().max()).item()
    t_plan = timeit(lambda: block_attention(dev, case, B, H, D), dev, reps=reps)
    t_attn = timeit(lambda: attn(0, q, kb, vb), dev, reps=reps)
    t_ref = timeit(
        lambda: [attend_rows(q[i * B : (i + 1) * B], kc[0][s], vc[0][s], D**-0.5) for i, s in enumerate(kv_slots)],
        dev,
        reps=reps,
    )
    return {
        "op": "block_attention",
        "device": dev,
        "layout": f"{H}/{Hkv}/{D}",
        "kv_dtype": str(kv_dtype),
        "batch": bs,
        "context": ctx,
        "rel_err": rel_err,
        "ok": rel_err < REL_TOL[kv_dtype],
        "plan_ms": t_plan * 1e3,
        "op_ms": t_attn * 1e3,
        "ref_ms": t_ref * 1e3,
        "speedup": t_ref / t_attn,
    }


def check_backend(dev):
    """The compiled extension (not the torch reference) serves both ops, with CUDA kernels on GPU."""
    backend = kernels.load()
    keys = ["CPU"] + (["CUDA"] if dev == "cuda" else [])
    has = {
        f"{name}:{key}": torch._C._dispatch_has_kernel_for_dispatch_key(f"sglang_dflash::{name}", key)
        for name in kernels.SCHEMAS
        for key in keys
        if key == "CPU" or name not in kernels.CPU_ONLY
    }
    return {
        "op": "backend",
        "device": dev,
        "backend": backend,
        "kernels": has,
        "ok": backend == "extension" and all(has.values()),
    }


def block_attention_rows(dev, quick):
    """Every layout and cache dtype at one short-context batch (where a causal mix-up shows: the
    block is a large share of the keys), then the served layouts over the timing shapes."""
    cpu_cases = [(name, dtype) for name in LAYOUTS for dtype in (torch.float32, torch.bfloat16)]
    cases = GPU_CASES if dev == "cuda" else cpu_cases
    rows = [check_block_attention(dev, 8, 4, layout, dtype) for layout, dtype in cases]
    shapes = [(1, 64), (4, 200)] if quick else [(1, 512), (8, 2048), (32, 1024), (64, 4096)]
    served = cases[:2] if dev == "cuda" else cpu_cases[:1] + cpu_cases[2:3]  # 9/3/64 and 32/8/128
    return rows + [check_block_attention(dev, bs, ctx, layout, dtype) for layout, dtype in served for bs, ctx in shapes]


def warm(index: int):
    """Build one FlashInfer JIT module (GPU_CASES[index], or the sampling kernels past the end) so
    gpu_check.sh can build them all side by side while the extension compiles: one after another
    they take most of the ten minutes on a machine without prebuilt kernels."""
    if index < len(GPU_CASES):
        layout, dtype = GPU_CASES[index]
        H, Hkv, D = LAYOUTS[layout]
        case = block_case("cuda", 2, 4, (H, Hkv, D), dtype)
        block_attention("cuda", case, 16, H, D)(0, *case[-4:-1])
    else:
        check_sampling_order("cuda")
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "checks", "reports", "gpu_check_kernels.json"))
    ap.add_argument("--quick", action="store_true", help="small shapes (CI's CPU mode)")
    ap.add_argument("--warm", type=int, help="only build FlashInfer JIT module #WARM (see warm())")
    a = ap.parse_args()
    if a.warm is not None:
        return warm(a.warm)
    dev = a.device
    rows = [check_backend(dev), check_accept(dev)]
    T = 256 if a.quick else 2048
    for D in (64, 128, 256) if dev == "cuda" else (64, 128):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            rows.append(check_write(dev, D, dtype, T=T))
        rows.append(check_write(dev, D, torch.float32, T=T, cache_dtype=torch.float8_e4m3fn, kv_scale=0.5))
    rows += block_attention_rows(dev, a.quick)
    rows += check_sampling_order(dev)  # our filter vs FlashInfer's sampling kernels (GPU only)
    report = {
        "tier": "kernels",
        "device": dev,
        "backend": kernels.load(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if dev == "cuda" else platform.processor(),
        "results": rows,
        "ok": all(r["ok"] for r in rows),
        **provenance.stamp(),  # the commit (and dirty flag) this report measured
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    for r in rows:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    print("gpu_check kernels:", "PASS" if report["ok"] else "FAIL", "->", a.out)
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
