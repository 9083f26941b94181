"""CPU microbenchmark: each csrc/ op against its torch reference (5 drafter layers, 2048 tokens,
head_dim 64 and 128; rope_qk and rms_norm at the embedded target's shapes; chain_attention against the gather + SDPA
path it replaces, one layer), measured side by side in one run (the timing code is the GPU check's,
bench/checks/gpu_check.py). Appends one run to bench/results/ops_cpu.jsonl and prints its table."""

from __future__ import annotations

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "bench"), os.path.join(ROOT, "bench", "checks")]
import provenance  # noqa: E402
from gpu_check import check_accept, check_write, timeit  # noqa: E402
from sglang_dflash import kernels  # noqa: E402
from sglang_dflash.kernels.reference import rms_norm_ref, rope_qk_ref  # noqa: E402
from sglang_dflash.pipeline import attention  # noqa: E402


OUT = os.path.join(ROOT, "bench", "results", "ops_cpu.jsonl")


def check_rope(T: int, hq=9, hk=3, head=64) -> dict:
    """rope_qk vs SGLang's RotaryEmbedding.forward_native op sequence (rope_qk_ref), the embedded
    target's heads, bf16: T tokens (1: a decode step; 16, 128: verify rows of a batch)."""
    g = torch.Generator().manual_seed(T)
    cache = torch.randn(4096, head, generator=g).bfloat16()
    pos = torch.randint(0, 4096, (T,), generator=g)
    q, k = torch.randn(T, hq * head, generator=g).bfloat16(), torch.randn(T, hk * head, generator=g).bfloat16()
    op = kernels.ops().rope_qk
    ok = all(
        torch.equal(a, b) for a, b in zip(op(pos, q, k, cache, head, True), rope_qk_ref(pos, q, k, cache, head, True))
    )
    t_op = timeit(lambda: op(pos, q, k, cache, head, True), "cpu", reps=200)
    t_ref = timeit(lambda: rope_qk_ref(pos, q, k, cache, head, True), "cpu", reps=200)
    return {"op": "rope_qk", "tokens": T, "dtype": "torch.bfloat16", "ok": ok, "op_ms": t_op * 1e3, "ref_ms": t_ref * 1e3, "speedup": t_ref / t_op}  # fmt: skip


def check_norm(T: int, hidden=576) -> dict:
    """rms_norm vs SGLang's RMSNorm.forward_native op sequence with the residual add (rms_norm_ref),
    the embedded target's hidden size, bf16: T tokens (1: a decode step; 16, 64: verify rows; 512: prefill)."""
    g = torch.Generator().manual_seed(T)
    x, r = torch.randn(T, hidden, generator=g).bfloat16(), torch.randn(T, hidden, generator=g).bfloat16()
    w = torch.randn(hidden, generator=g).bfloat16()
    op = kernels.ops().rms_norm
    ok = all(torch.equal(a, b) for a, b in zip(op(x, r, w, 1e-5), rms_norm_ref(x, r, w, 1e-5)))
    t_op = timeit(lambda: op(x, r, w, 1e-5), "cpu", reps=200)
    t_ref = timeit(lambda: rms_norm_ref(x, r, w, 1e-5), "cpu", reps=200)
    return {"op": "rms_norm", "tokens": T, "dtype": "torch.bfloat16", "ok": ok, "op_ms": t_op * 1e3, "ref_ms": t_ref * 1e3, "speedup": t_ref / t_op}  # fmt: skip


def check_chain(bs: int, B: int, keys=320, heads=(9, 3, 64)) -> dict:
    """chain_attention vs attend_plan (index_select the visible K/V rows, then SDPA) for one layer of
    the embedded target's heads, bf16: bs requests of B causal rows, ~`keys` keys each, scattered slots."""
    H, Hkv, D = heads
    g = torch.Generator().manual_seed(bs * 100 + B)
    S = 16384
    k, v = torch.randn(S, Hkv, D, generator=g).bfloat16(), torch.randn(S, Hkv, D, generator=g).bfloat16()
    prefix = keys + 7 * torch.arange(bs)
    slots = torch.stack([torch.randperm(S, generator=g)[: int(prefix.max()) + B] for _ in range(bs)])
    q = torch.randn(bs * B, H, D, generator=g).bfloat16()
    plan = attention.plan_rows(slots, prefix, B, prefix.tolist(), causal=True)
    op = kernels.ops().chain_attention
    got, want = op(q, k, v, slots, prefix, 0.125, True), attention.attend_plan(plan, q, k, v, 0.125)
    ok = bool((got.float() - want.float()).abs().max() < 2e-2)
    t_op = timeit(lambda: op(q, k, v, slots, prefix, 0.125, True), "cpu", reps=50)
    t_ref = timeit(lambda: attention.attend_plan(plan, q, k, v, 0.125), "cpu", reps=50)
    return {"op": "chain_attention", "batch": bs, "block": B, "keys": keys, "dtype": "torch.bfloat16", "ok": ok, "op_ms": t_op * 1e3, "ref_ms": t_ref * 1e3, "speedup": t_ref / t_op}  # fmt: skip


def main(out=OUT):
    prov = provenance.stamp()  # before the run writes its result rows
    rows = [check_write("cpu", D, dt) for D in (64, 128) for dt in (torch.float32, torch.bfloat16)]
    rows.append(check_accept("cpu"))
    rows += [check_rope(T) for T in (1, 16, 128)]
    rows += [check_norm(T) for T in (1, 16, 64, 512)]
    rows += [check_chain(bs, B) for bs in (1, 16) for B in (1, 2, 4, 8)]
    keep = ("commit", "dirty", "dirty_files", "time", "host")
    provenance.append_rows(out, [{**r, **{k: prov[k] for k in keep}} for r in rows], prov)
    # chain_attention's reference column is the gather + SDPA path it replaces
    print("| op | shape | dtype | C++ ms | torch ref ms | speedup |\n|---|---|---|---|---|---|")
    for r in rows:
        if r["op"] == "rope_qk":
            shape = f"T={r['tokens']} heads 9/3/64"
        elif r["op"] == "rms_norm":
            shape = f"T={r['tokens']} hidden 576"
        else:
            shape = f"L=5 T=2048 D={r['head_dim']}" if "head_dim" in r else f"bs={r['batch']} B={r['block']}"
        print(
            f"| {r['op']} | {shape} | {r.get('dtype', 'int64').replace('torch.', '')} | {r['op_ms']:.2f} | "
            f"{r['ref_ms']:.2f} | {r['speedup']:.1f}x |"
        )
    assert all(r["ok"] for r in rows)


if __name__ == "__main__":
    main()
