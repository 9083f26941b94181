"""CPU step time of the draft stage per (batch, width): eager vs the step-graph CPU twin
(pipeline/step_graphs.py EagerGraphs: padded to SGLang's CPU capture buckets, static buffers) vs the
twin compiled per shape (CompiledGraphs: torch.compile, its compile seconds reported), in one run, the shipped drafter in bf16 on one thread, the worker's own step function (block attention
over a random context KV of --ctx tokens per request, draft.propose, the target's LM head rows).

    OMP_NUM_THREADS=1 SGLANG_USE_CPU_ENGINE=1 python bench/graphs_bench.py [--bs 1 4 17 32] [--width 4 8 16]

Arms alternate within each repeat; a row is the median over repeats. Appends one run to
bench/results/graphs_bench.jsonl.
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
from sglang_dflash.model.loader import load_drafter  # noqa: E402
from sglang_dflash.pipeline.attention_choice import block_attention  # noqa: E402
from sglang_dflash.pipeline.context_kv import DraftKVCache  # noqa: E402
from sglang_dflash.pipeline.draft import propose  # noqa: E402
from sglang_dflash.pipeline.step_graphs import CompiledGraphs, EagerGraphs, StepGraphs  # noqa: E402
from sglang_dflash.train.__main__ import DRAFTER_DIR  # noqa: E402
from sglang_dflash.train.target_files import load_target_tensor  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "results", "graphs_bench.jsonl")
CPU_BUCKETS = list(range(1, 17)) + list(range(18, 33, 2))  # SGLang 0.5.23's decode list on CPU (its log)


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 4, 17, 32])
    ap.add_argument("--width", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_drafter_config(DRAFTER_DIR, 30)
    drafter = load_drafter(DRAFTER_DIR, cfg, torch.bfloat16, "cpu")
    embed = load_target_tensor(derive(), ("model.embed_tokens.weight", "lm_head.weight"))
    head = embed[drafter.to_target(torch.arange(cfg.draft_vocab_size or embed.shape[0]))].contiguous()
    B, n = cfg.block_size, max(a.bs) + 1  # request-pool row 0 and KV slot 0: SGLang's padding
    cache = DraftKVCache(cfg.num_layers, 1 + n * (a.ctx + B), cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, "cpu")
    cache.k.normal_()
    cache.v.normal_()
    req_to_token = torch.zeros(n, a.ctx + B, dtype=torch.int32)
    req_to_token[1:] = 1 + torch.arange((n - 1) * (a.ctx + B), dtype=torch.int32).view(n - 1, -1)

    def step(width):
        def run(pool_rows, prefix, slots, block_ids, positions):
            attend = block_attention(cfg, B, False, cache, req_to_token, pool_rows, prefix, slots.reshape(-1))
            p = propose(drafter, attend, lambda t: embed[t], lambda h: h @ head.t(), block_ids, positions, width=width)
            return p.tokens, p.failed

        return run

    pads = dict(pool_rows=0, prefix=0, slots=0, block_ids=cfg.mask_token_id, positions=0)
    graphs = StepGraphs(CPU_BUCKETS, EagerGraphs())
    compiled = StepGraphs(CPU_BUCKETS, CompiledGraphs())
    prov, rows = provenance.stamp(), []
    for bs in a.bs:
        pool_rows = torch.arange(1, bs + 1)
        inputs = dict(
            pool_rows=pool_rows,
            prefix=torch.full((bs,), a.ctx),
            slots=req_to_token[pool_rows, a.ctx :].to(torch.int64),
            block_ids=torch.full((bs, B), cfg.mask_token_id),
            positions=torch.arange(a.ctx, a.ctx + B).repeat(bs, 1),
        )
        for w in a.width:
            fn, t = step(w), {"eager": [], "graphs": [], "compiled": []}
            t0 = time.perf_counter()
            compiled.run(fn, inputs, pads, key=(w,))  # the capture: compiles this shape
            compile_s = time.perf_counter() - t0
            for i in range(a.repeats + 2):
                for arm in t:
                    t0 = time.perf_counter()
                    if arm == "eager":
                        fn(**inputs)
                    else:
                        (graphs if arm == "graphs" else compiled).run(fn, inputs, pads, key=(w,))
                    if i >= 2:
                        t[arm].append((time.perf_counter() - t0) * 1e3)
            e, g, c = (statistics.median(t[k]) for k in ("eager", "graphs", "compiled"))
            row = dict(bs=bs, bucket=graphs.bucket(bs), width=w, eager_ms=round(e, 3), graphs_ms=round(g, 3))
            row.update(compiled_ms=round(c, 3), compile_s=round(compile_s, 1))
            row.update(graphs_over_eager=round(g / e, 3), compiled_over_eager=round(c / e, 3), ctx=a.ctx, threads=1)
            row.update({k: prov[k] for k in ("commit", "dirty", "time", "host")})
            print(json.dumps(row), flush=True)
            rows.append(row)
    provenance.append_rows(OUT, rows, prov)


if __name__ == "__main__":
    main()
