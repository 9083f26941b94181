"""One-shot device check (driven by gpu_check.sh). Tier `kernels` needs only torch (+ FlashInfer on
GPU), not SGLang: the ops against their torch references (write_draft_kv: the whole K and V
caches, with a random k_norm weight), the drafter's batched non-causal block
attention against an SDPA reference, and timings of each against its reference.
Writes one JSON report."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
import provenance  # noqa: E402  (bench/, the script's own folder)
from sglang_dflash import kernels  # noqa: E402
from sglang_dflash.pipeline.attention import TorchBlockAttention, attend_rows  # noqa: E402
from sglang_dflash.kernels.reference import (
    linear_verify_accept_ref,
    rope_cos_sin_cache,  # noqa: E402
    write_draft_kv_ref,
)


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


def check_write(dev, D, dtype, L=5, T=2048, H=8):
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
    kc, vc = (torch.randn(L, S, H, D, generator=g).to(dev, dtype) for _ in range(2))
    kr, vr = kc.clone(), vc.clone()
    op = kernels.ops().write_draft_kv
    op(k, v, w, cs, pos, slots, kc, vc, 1e-6, True, 1.0)
    write_draft_kv_ref(k, v, w, cs, pos, slots, kr, vr, 1e-6, True)
    k_err, v_err = cache_err(kc, kr), cache_err(vc, vr)
    t_op = timeit(lambda: op(k, v, w, cs, pos, slots, kc, vc, 1e-6, True, 1.0), dev)
    t_ref = timeit(lambda: write_draft_kv_ref(k, v, w, cs, pos, slots, kr, vr, 1e-6, True), dev)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    return {
        "op": "write_draft_kv",
        "device": dev,
        "head_dim": D,
        "dtype": str(dtype),
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


def check_block_attention(dev, bs, ctx, page_dtype=torch.bfloat16, B=16, H=32, Hkv=8, D=128):
    """Batched non-causal block attention (FlashInfer on GPU, torch on CPU) vs per-request SDPA."""
    g = torch.Generator().manual_seed(2)
    dtype = page_dtype if dev == "cuda" else torch.float32
    S = bs * (ctx + B) * 2
    kc = torch.randn(1, S, Hkv, D, generator=g).to(dev, dtype)
    vc = torch.randn(1, S, Hkv, D, generator=g).to(dev, dtype)
    perm = torch.randperm(S, generator=g).to(dev)
    prefix = torch.tensor([max(1, ctx - 7 * i) for i in range(bs)], device=dev)
    req_to_token = torch.zeros(bs, ctx + B, dtype=torch.int32, device=dev)
    off = 0
    for i, p in enumerate(prefix.tolist()):
        req_to_token[i, : p + B] = perm[off : off + p + B].to(torch.int32)
        off += p + B
    cols = torch.arange(B, device=dev)
    block_slots = req_to_token[torch.arange(bs, device=dev)[:, None], prefix[:, None] + cols].reshape(-1).long()
    q = torch.randn(bs * B, H, D, generator=g).to(dev, dtype)
    kb, vb = (torch.randn(bs * B, Hkv, D, generator=g).to(dev, dtype) for _ in range(2))
    kv_slots = [req_to_token[i, : p + B].long() for i, p in enumerate(prefix.tolist())]
    if dev == "cuda":
        from sglang_dflash.pipeline.flashinfer_attention import FlashInferBlockAttention

        attn = FlashInferBlockAttention(
            kc, vc, req_to_token, torch.arange(bs, device=dev), prefix, block_slots, B, H, D**-0.5
        )
    else:
        attn = TorchBlockAttention(kc, vc, kv_slots, block_slots, D**-0.5)
    out = attn(0, q, kb, vb)
    ref = torch.cat(
        [
            attend_rows(q[i * B : (i + 1) * B].float(), kc[0][s].float(), vc[0][s].float(), D**-0.5)
            for i, s in enumerate(kv_slots)
        ]
    )
    err = (out.float() - ref).abs().max().item()
    t_attn = timeit(lambda: attn(0, q, kb, vb), dev, reps=10)
    t_ref = timeit(
        lambda: [attend_rows(q[i * B : (i + 1) * B], kc[0][s], vc[0][s], D**-0.5) for i, s in enumerate(kv_slots)],
        dev,
        reps=10,
    )
    return {
        "op": "block_attention",
        "device": dev,
        "batch": bs,
        "context": ctx,
        "max_err": err,
        "ok": err < (2e-2 if dtype != torch.float32 else 1e-4),
        "op_ms": t_attn * 1e3,
        "ref_ms": t_ref * 1e3,
        "speedup": t_ref / t_attn,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="bench/results/gpu_check_kernels.json")
    ap.add_argument("--quick", action="store_true", help="small shapes (CI's CPU mode)")
    a = ap.parse_args()
    dev = a.device
    rows = [check_accept(dev)]
    for D in (64, 128):
        for dtype in (torch.float32, torch.bfloat16):
            rows.append(check_write(dev, D, dtype, T=256 if a.quick else 2048))
    shapes = [(1, 64), (4, 200)] if a.quick else [(1, 512), (8, 2048), (32, 1024), (64, 4096)]
    rows += [check_block_attention(dev, bs, ctx) for bs, ctx in shapes]
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
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    for r in rows:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    print("gpu_check kernels:", "PASS" if report["ok"] else "FAIL", "->", a.out)
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
