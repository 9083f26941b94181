"""CPU timing of the draft stage (draft.propose: the drafter's block forward + the LM head over the
block's proposal slots) for the shipped drafter, with the full 49,152-token head and with reduced
draft vocabularies (model/draft_vocab.py), at batch 1 / 4 / 16, one thread, bf16.

    OMP_NUM_THREADS=1 SGLANG_USE_CPU_ENGINE=1 python bench/draft_head_bench.py [--vocab 0 16384 8192 4096]
        [--width W [W ...]] [--unfused] [--uncut] [--flush-mb 256] [--gemm torch ours]

--width W: the step verifies W rows, so the head scores W-1 slots (served c=1 steps are mostly W 8).
--unfused: beside each vocabulary, the drafter without its fused q/k/v and gate/up matmuls
(DFlashDrafter.fuse_projections), to measure what the fusion buys.
--uncut: beside each vocabulary, the drafter running its last MLP over the whole block, not only the
W rows the step reads (the row cut of DrafterLayer.forward), to measure what the cut buys.
--gemm torch ours: the drafter's matmuls and head through torch (F.linear / @) and through the CPU
GEMM kernel a DFLASH server routes them to (cpu/cpu_linear.linear, DFlashDrafter.route_matmuls).
--flush-mb M: read M MiB between calls so the weights come from memory, not cache, as when serving
(the target's verify, 270 MB of weights, runs between two draft steps).

Arms alternate within each repeat (drift hits all alike); a row reports the median over repeats.
Appends one run to bench/results/draft_head.jsonl.
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

from sglang_dflash.embedded import derive  # noqa: E402
from sglang_dflash.model.config import load_drafter_config  # noqa: E402
from sglang_dflash.model.draft_vocab import d2t_from_ids  # noqa: E402
from sglang_dflash.model.drafter import block_prefix  # noqa: E402
from sglang_dflash.model.loader import load_drafter  # noqa: E402
from sglang_dflash.pipeline.attention import TorchBlockAttention  # noqa: E402
from sglang_dflash.pipeline.context_kv import DraftKVCache  # noqa: E402
from sglang_dflash.pipeline.draft import propose  # noqa: E402
from sglang_dflash.cpu import cpu_linear  # noqa: E402
from sglang_dflash.train.__main__ import DRAFTER_DIR  # noqa: E402
from sglang_dflash.train.target_files import load_target_tensor  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "results", "draft_head.jsonl")
SHOWN = ("bs", "width", "draft_vocab", "fused", "cut", "gemm", "draft_ms", "head_ms", "vs_first")  # printed per row


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def unfused(drafter):
    """The drafter as the training code runs it: three q/k/v and two gate/up matmuls."""
    for layer in drafter.layers:
        del layer.self_attn.qkv_weight, layer.mlp.gate_up_weight
    return drafter


def uncut(drafter):
    """The drafter before the last-layer row cut: every block row through the last MLP, then sliced."""
    whole = drafter.forward

    def forward(x, positions, attend, block=None, keep=None):
        out = whole(x, positions, attend, block)
        return out if keep is None else block_prefix(out, block, keep)

    drafter.forward = forward
    return drafter


def draft_call(drafter, cfg, embed: torch.Tensor, head: torch.Tensor, bs: int, ctx: int, width=None, mm=None):
    """-> a no-argument call of the draft stage (draft.propose) at batch bs over a random context
    KV of ctx tokens; embed [V, H] the target's embedding, head [N, H] the LM head rows scored."""
    B = cfg.block_size
    cache = DraftKVCache(cfg.num_layers, bs * (ctx + B), cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, "cpu")
    cache.k.normal_()
    cache.v.normal_()
    slots = torch.arange(bs * (ctx + B)).view(bs, ctx + B)
    attend = TorchBlockAttention(cache.k, cache.v, list(slots), slots[:, ctx:].reshape(-1), cfg.head_dim**-0.5)
    block = torch.full((bs, B), cfg.mask_token_id)
    pos = torch.arange(ctx, ctx + B).repeat(bs, 1)
    mm = mm or (lambda x, w: x @ w.t())
    return lambda: propose(drafter, attend, lambda t: embed[t], lambda h: mm(h, head), block, pos, width=width)


@torch.inference_mode()
def setup(bs: int, ctx: int, vocab: int, width=None, fused: bool = True, cut: bool = True, gemm: str = "torch"):
    cfg = load_drafter_config(DRAFTER_DIR, 30)
    drafter = load_drafter(DRAFTER_DIR, cfg, torch.bfloat16, "cpu")
    drafter = drafter if fused else unfused(drafter)
    drafter = drafter if cut else uncut(drafter)
    mm = None
    if gemm == "ours":
        if not cpu_linear.enable("cpu", torch.bfloat16):
            raise SystemExit(
                "--gemm ours: the CPU GEMM kernel is off here (SGLANG_DFLASH_CPU_OPS linear=, the extension)"
            )
        mm = cpu_linear.linear
        drafter.route_matmuls(mm)
    head = load_target_tensor(derive())  # [V, H] bf16, the tied LM head
    if vocab:  # any N ids time the same: the cut is a smaller matmul
        drafter.register_buffer("d2t", d2t_from_ids(torch.arange(vocab)))
        head = head[:vocab].contiguous()
    elif hasattr(drafter, "d2t"):  # the full head: the drafter as a checkpoint without the mapping
        del drafter.d2t
    embed = load_target_tensor(derive(), ("model.embed_tokens.weight", "lm_head.weight"))
    rows = torch.randn(bs * (cfg.block_size - 1), cfg.hidden_size, dtype=torch.bfloat16)
    mm_head = mm or (lambda x, w: x @ w.t())
    return draft_call(drafter, cfg, embed, head, bs, ctx, width, mm), lambda: mm_head(rows, head)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, nargs="+", default=[0, 16384, 8192, 4096])
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--width", type=int, nargs="+", default=[None], help="rows verified (default: the whole block)")
    ap.add_argument("--unfused", action="store_true", help="also time each vocabulary without the fused matmuls")
    ap.add_argument("--uncut", action="store_true", help="also time each vocabulary without the last-layer row cut")
    ap.add_argument("--gemm", nargs="+", default=["torch"], choices=("torch", "ours"), help="matmul arms")
    ap.add_argument("--flush-mb", type=int, default=0, help="MiB read between calls (serving-like cold weights)")
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(1)
    prov = provenance.stamp()
    junk = torch.ones(a.flush_mb * 2**18) if a.flush_mb else None  # float32: 4 bytes a value
    flush = (lambda: junk.sum()) if junk is not None else (lambda: None)
    forms = [(f, c, g) for f in (True, False)[: 1 + a.unfused] for c in (True, False)[: 1 + a.uncut] for g in a.gemm]
    keys = [(v, *form) for v in a.vocab for form in forms]
    rows = []
    for bs, width in ((bs, w) for bs in a.bs for w in a.width):
        arms = {k: setup(bs, a.ctx, k[0], width, *k[1:]) for k in keys}
        times = {k: ([], []) for k in keys}
        for _ in range(3):
            for run, head in arms.values():
                run(), head()
        for _ in range(a.repeats):
            for k, (run, head) in arms.items():
                flush()
                times[k][0].append(timed(run))
                flush()
                times[k][1].append(timed(head))
        full = statistics.median(times[keys[0]][0])
        for v, fused, cut, gemm in keys:
            draft, head = (statistics.median(t) for t in times[v, fused, cut, gemm])
            row = {"bs": bs, "ctx": a.ctx, "draft_vocab": v or 49152, "fused": fused, "cut": cut, "gemm": gemm}
            row["width"] = width
            row.update(flush_mb=a.flush_mb, draft_ms=round(draft, 2), head_ms=round(head, 2))
            row.update(vs_first=round(draft / full, 3), **prov)
            rows.append(row)
            print(json.dumps({k: row[k] for k in SHOWN}))
    provenance.append_rows(OUT, rows, prov)


if __name__ == "__main__":
    main()
