"""CPU timing of the two torch attention paths, per layer call: the per-request loop they replaced
("before", copied below as the baseline) vs the batched code in the package ("after": one SDPA call
per length group) and, to show why it groups, the same code forced to one padded call ("one_call":
what the path does without host lengths, e.g. on CUDA).

- verify: SGLang's torch_native TARGET_VERIFY hook (srt/verify_backend.torch_native_verify, called once
  per target layer): slot lookup + causal attention. The KV write both share is left out.
- draft: the drafter's block attention (srt/target_model.block_attention, torch branch): "setup" once
  per draft step (slot lists / table + masks), "call" once per drafter layer (block K/V write + attention).
The real model's shapes (9 q / 3 kv heads, head_dim 64), prefixes uniform in 100..800 (fixed seed), one
thread; before and after alternate run by run so drift on a shared machine hits both.
    OMP_NUM_THREADS=1 SGLANG_USE_CPU_ENGINE=1 python bench/attention_bench.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import provenance  # noqa: E402

from sglang_dflash.pipeline import attention  # noqa: E402
from sglang_dflash.srt import verify_backend  # noqa: E402
from sglang_dflash.srt.cpu_shims import install_cpu_shims  # noqa: E402
from sglang_dflash.srt.target_model import block_attention  # noqa: E402

H, HKV, D = 9, 3, 64


# --- before: the per-request code as it was (pipeline/attention.py, srt/verify_backend.py, target_model.py)


def old_attend_rows(q, k, v, scale, causal_prefix=None):
    mask = None
    if causal_prefix is not None:
        qpos = torch.arange(q.shape[0], device=q.device)[:, None] + causal_prefix
        mask = torch.arange(k.shape[0], device=q.device)[None, :] <= qpos
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.squeeze(0).transpose(0, 1)


def old_torch_native_verify(backend, q, layer, forward_batch):
    bs = forward_batch.batch_size
    block = q.shape[0] // bs
    prefix = forward_batch.seq_lens.tolist()
    rows = backend.req_to_token_pool.req_to_token[forward_batch.req_pool_indices]
    slots = [rows[i, : p + block].to(torch.int64) for i, p in enumerate(prefix)]
    q_ = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
    kc, vc = backend.token_to_kv_pool.get_key_buffer(0), backend.token_to_kv_pool.get_value_buffer(0)
    out = torch.empty_like(q_)
    for i, (s, p) in enumerate(zip(slots, prefix)):
        r = slice(i * block, (i + 1) * block)
        out[r] = old_attend_rows(q_[r], kc[s], vc[s], layer.scaling, causal_prefix=p)
    return out.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)


class OldBlockAttention:
    """The old TorchBlockAttention (full-attention layers: the shipped drafters have no window)."""

    def __init__(self, k_cache, v_cache, req_to_token, batch, prefix, block_slots, block, scale):
        rows = zip(batch.req_pool_indices.tolist(), prefix.tolist())
        self.kv_slots = [req_to_token[r, : p + block].to(torch.int64) for r, p in rows]
        self.k, self.v, self.block_slots, self.scale = k_cache, v_cache, block_slots, scale

    def __call__(self, layer, q, k_blk, v_blk):
        kc, vc = self.k[layer], self.v[layer]
        kc.index_copy_(0, self.block_slots, k_blk.to(kc.dtype))
        vc.index_copy_(0, self.block_slots, v_blk.to(vc.dtype))
        block = q.shape[0] // len(self.kv_slots)
        out = torch.empty_like(q)
        for i, slots in enumerate(self.kv_slots):
            r = slice(i * block, (i + 1) * block)
            out[r] = old_attend_rows(q[r], kc[slots], vc[slots], self.scale)
        return out


# --- harness


def one_call(fn):
    """fn as it runs without host lengths: a single SDPA call over all requests padded to the longest."""

    def run():
        saved, attention.host_lengths = attention.host_lengths, lambda prefix: None
        try:
            return fn()
        finally:
            attention.host_lengths = saved

    return run


def paired_medians(fns: dict, runs: int, warmup: int = 2) -> dict:
    """fns: name -> callable. Runs them alternately; -> name -> median seconds."""
    times = {n: [] for n in fns}
    for i in range(warmup + runs):
        for n, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def pool(bs: int, B: int, dtype, layers: int | None, seed: int):
    """Prefixes uniform in 100..800; a shuffled paged KV; req_to_token rows in a shuffled pool."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(100, 801, (bs,), generator=g)
    lens = (prefix + B).tolist()
    S = sum(lens) + 1
    shape = (S, HKV, D) if layers is None else (layers, S, HKV, D)
    k, v = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    req_to_token = torch.zeros(bs + 8, 1024, dtype=torch.int32)
    rpi = torch.randperm(bs + 8, generator=g)[:bs]
    for r, s in zip(rpi.tolist(), torch.randperm(S, generator=g)[: sum(lens)].split(lens)):
        req_to_token[r, : s.numel()] = s.to(torch.int32)
    return prefix, k, v, req_to_token, rpi


@torch.inference_mode()
def verify_case(bs: int, B: int, dtype, runs: int) -> dict:
    prefix, k, v, r2t, rpi = pool(bs, B, dtype, None, seed=bs * 100 + B)
    kv = SimpleNamespace(get_key_buffer=lambda i: k, get_value_buffer=lambda i: v)
    backend = SimpleNamespace(token_to_kv_pool=kv, req_to_token_pool=SimpleNamespace(req_to_token=r2t))
    fb = SimpleNamespace(batch_size=bs, seq_lens=prefix, seq_lens_cpu=prefix.clone(), req_pool_indices=rpi)
    layer = SimpleNamespace(tp_q_head_num=H, qk_head_dim=D, v_head_dim=D, layer_id=0, scaling=D**-0.5)
    q = torch.randn(bs * B, H * D).to(dtype)
    before = lambda: old_torch_native_verify(backend, q, layer, fb)  # noqa: E731
    after = lambda: verify_backend.torch_native_verify(backend, q, None, None, layer, fb, False)  # noqa: E731
    err = (before().float() - after().float()).abs().max().item()
    t = paired_medians({"before": before, "after": after, "one_call": one_call(after)}, runs)
    return {"op": "verify", **{f"call_{a}_s": t[a] for a in t}, "max_abs_diff": err}


@torch.inference_mode()
def draft_case(bs: int, B: int, dtype, runs: int) -> dict:
    prefix, k, v, r2t, rpi = pool(bs, B, dtype, 1, seed=bs * 100 + B + 7)
    kvc = SimpleNamespace(k=k, v=v)
    batch = SimpleNamespace(req_pool_indices=rpi)
    cfg = SimpleNamespace(head_dim=D, layer_windows=[None], num_heads=H)
    slots = torch.stack([r2t[r, p : p + B] for r, p in zip(rpi.tolist(), prefix.tolist())]).reshape(-1).long()
    q = torch.randn(bs * B, H, D).to(dtype)
    kb, vb = torch.randn(bs * B, HKV, D).to(dtype), torch.randn(bs * B, HKV, D).to(dtype)
    setup = {
        "before": lambda: OldBlockAttention(k, v, r2t, batch, prefix, slots, B, D**-0.5),
        "after": lambda: block_attention(cfg, B, False, kvc, r2t, batch, prefix, slots),
    }
    old, new, one = setup["before"](), setup["after"](), one_call(setup["after"])()
    err = (old(0, q, kb, vb).float() - new(0, q, kb, vb).float()).abs().max().item()
    ts = paired_medians(setup, runs)
    calls = {"before": old, "after": new, "one_call": one}
    tc = paired_medians({a: (lambda f=f: f(0, q, kb, vb)) for a, f in calls.items()}, runs)
    return {
        "op": "draft",
        **{f"call_{a}_s": tc[a] for a in tc},
        **{f"setup_{a}_s": ts[a] for a in ts},
        "max_abs_diff": err,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--out", default="bench/results/attention_bench.jsonl")
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--block", type=int, nargs="+", default=[1, 4, 16])
    args = ap.parse_args()
    torch.set_num_threads(1)
    install_cpu_shims()  # torch_native_verify imports SGLang's KV pool module, which imports sgl_kernel
    prov = provenance.stamp()
    extra = {"threads": torch.get_num_threads(), "runs": args.runs, **{k: prov[k] for k in ("commit", "dirty", "time")}}
    heads = {"q_heads": H, "kv_heads": HKV, "head_dim": D, "prefix": "uniform 100..800"}
    print(
        "| op | dtype | bs | B | before ms | after ms | ratio | one call ms | ratio | setup before ms | after | max diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with open(args.out, "w") as f:
        for op, case in (("verify", verify_case), ("draft", draft_case)):
            for dtype in (torch.bfloat16, torch.float32):
                for bs in args.bs:
                    for B in args.block:
                        r = case(bs, B, dtype, args.runs)
                        r = {**r, "dtype": str(dtype).replace("torch.", ""), "bs": bs, "block": B, **heads}
                        r["ratio"] = r["call_before_s"] / r["call_after_s"]  # > 1: the batched code is faster
                        r["ratio_one_call"] = r["call_before_s"] / r["call_one_call_s"]
                        f.write(json.dumps({**extra, **r}) + "\n")
                        f.flush()
                        setup = [r.get(f"setup_{a}_s") for a in ("before", "after")]
                        setup = " | ".join(f"{s * 1e3:.3f}" if s is not None else "-" for s in setup)
                        print(
                            f"| {op} | {r['dtype']} | {bs} | {B} | {r['call_before_s'] * 1e3:.3f} | "
                            f"{r['call_after_s'] * 1e3:.3f} | {r['ratio']:.2f} | {r['call_one_call_s'] * 1e3:.3f} | "
                            f"{r['ratio_one_call']:.2f} | {setup} | {r['max_abs_diff']:.1e} |",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
