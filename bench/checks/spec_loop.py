"""The loop check's speculative decoding loop (loop_check.py), SGLang-free and greedy: our drafter
and stages (model/, pipeline/) draft one block for a batch of requests through the step graphs
(CUDA graphs per (bucket, width) with FlashInfer's block attention on CUDA; the eager twin and torch
attention on CPU or without FlashInfer), the transformers target (hf_target.py) verifies each
request's block as a linear chain over its own cache, pipeline/accept.py accepts, and the committed
rows' target features are written into the drafter's context KV (pipeline/context_kv.py)."""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections import Counter

import torch

from hf_target import Target, crop
from sglang_dflash.model.config import default_target_layer_ids, parse_drafter_config
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.pipeline.accept import accept_block, stop_table
from sglang_dflash.pipeline.attention_choice import block_attention, capturable
from sglang_dflash.pipeline.block import block_slots, build_block
from sglang_dflash.pipeline.context_kv import DraftKVCache, write_context
from sglang_dflash.pipeline.draft import propose
from sglang_dflash.pipeline.step_graphs import CudaGraphs, EagerGraphs, StepGraphs
from sglang_dflash.testing.tiny_drafter import STEER_CHANNEL


class Drafting:
    """The drafter side of a worker: the drafter, its context KV by slot, the request pool's slot
    table (row 0 and slot 0: the padding a padded graph row reads and writes) and the step graphs."""

    def __init__(self, target: Target, layout: tuple, block: int, max_len: int, rows: int, buckets, seed: int = 0):
        """layout: the drafter's (heads, kv_heads, head_dim, layers); max_len: the most positions a
        request reaches (prompt + output); rows: request-pool rows (requests at once)."""
        heads, kv_heads, head_dim, layers = layout
        L, dev = target.num_layers, target.device
        # Layer outputs short of the last (HF returns the last one after the final norm).
        self.layer_ids = [0] if L <= 3 else default_target_layer_ids(L, 2)
        cfg = dict(hidden_size=target.config.hidden_size, num_hidden_layers=layers, num_attention_heads=heads,
                   num_key_value_heads=kv_heads, head_dim=head_dim, intermediate_size=target.config.intermediate_size,
                   vocab_size=target.vocab, block_size=block, rms_norm_eps=1e-6,
                   dflash_config={"mask_token_id": target.vocab - 1, "target_layer_ids": self.layer_ids})  # fmt: skip
        self.cfg = parse_drafter_config(cfg, L)
        torch.manual_seed(seed)
        with torch.device(dev):
            drafter = DFlashDrafter(self.cfg)
        with torch.no_grad():
            for name, p in drafter.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)
                    if name.endswith(("o_proj.weight", "down_proj.weight")):
                        p[STEER_CHANNEL] = 0  # steered: the drafter proposes the steer token (hf_target.py)
        self.cuda = torch.device(dev).type == "cuda"
        dtype = torch.bfloat16 if self.cuda else torch.float32
        self.drafter = drafter.to(dtype).eval().requires_grad_(False).fuse_projections()
        # Start-up: the RoPE table covers every position a request reaches + one block, so no draft
        # step sizes it (a captured step holds its address and may read nothing back).
        self.drafter.rope_table(max_len, dev)
        self.block, self.max_len, self.target = block, max_len, target
        self.kv = DraftKVCache(self.cfg.num_layers, 1 + rows * max_len, kv_heads, head_dim, dtype, dev)
        table = torch.zeros(rows + 1, max_len, dtype=torch.int32, device=dev)  # [rows + 1, max_len]
        table[1:] = 1 + torch.arange(rows * max_len, device=dev, dtype=torch.int32).view(rows, max_len)
        self.req_to_token = table
        # FlashInfer drafts on CUDA when it imports; torch attention otherwise (not capturable).
        self.flashinfer = self.cuda and importlib.util.find_spec("flashinfer") is not None
        self.graphs_mode = "cuda" if capturable(self.cfg, block, self.flashinfer, dtype) else "eager"
        backend = CudaGraphs() if self.graphs_mode == "cuda" else EagerGraphs()
        self.graphs = StepGraphs(buckets, backend, check_first=self.graphs_mode == "cuda")
        self.pads = dict(pool_rows=0, prefix=0, slots=0, block_ids=self.cfg.mask_token_id, positions=0)

    def draft(self, pool_rows, prefix, slots, block_ids, positions, width: int, graphs: bool = True):
        """pool_rows, prefix [bs]; slots, block_ids, positions [bs, B] -> tokens [bs, width] (column 0
        the anchor), failed [bs] bool. graphs False: the same step eagerly, unpadded."""
        cfg, B, t = self.cfg, self.block, self.target

        def plan(attend, fixed, pool_rows, prefix, slots, **_):  # host work, outside a captured step
            args = (cfg, B, self.flashinfer, self.kv, self.req_to_token, pool_rows, prefix, slots.reshape(-1))
            return block_attention(*args, reuse=attend, fixed=fixed)

        def step(attend, pool_rows, prefix, slots, block_ids, positions):
            head = lambda h: t.head(h.float())  # noqa: E731  [N, H] -> [N, V]
            p = propose(self.drafter, attend, t.embed, head, block_ids, positions, None, None, width, 0, False)
            return p.tokens, p.failed

        args = dict(pool_rows=pool_rows, prefix=prefix, slots=slots, block_ids=block_ids, positions=positions)
        if not graphs:
            return step(plan(None, False, **args), **args)
        return self.graphs.run(step, args, self.pads, key=(width,), prepare=plan)

    def commit(self, feats, row: int, start: int, n: int) -> None:
        """feats [>= n, K*H]: the target's features of positions start .. start+n-1 of pool row `row`."""
        if n:
            dev = feats.device
            pos = torch.arange(start, start + n, device=dev)  # [n]
            slots = self.req_to_token[row, start : start + n].to(torch.int64)  # [n]
            write_context(self.drafter, self.kv, feats[:n], pos, slots, max_position=self.max_len)

    def batch(self, rows: list[int], prefix: list[int], anchors: list[int]):
        """-> pool_rows, prefix [bs]; slots, block_ids, positions [bs, B] for the next draft step."""
        dev = self.target.device
        pool_rows = torch.tensor(rows, device=dev)
        prefix_t, anchors_t = torch.tensor(prefix, device=dev), torch.tensor(anchors, device=dev)
        block_ids, positions = build_block(anchors_t, prefix_t, self.block, self.cfg.mask_token_id)
        slots = block_slots(self.req_to_token, pool_rows, prefix_t, self.block)
        return pool_rows, prefix_t, slots, block_ids, positions


def decode(d: Drafting, prompts: list[list[int]], max_new: int, widths: list[int]) -> dict:
    """Speculative greedy decoding of `prompts` (one pool row each, rows 1..), the step's verify
    width cycling through `widths`. -> outputs, verify steps (request-steps), accepted drafts."""
    t, dev = d.target, d.target.device
    reqs = []
    for r, prompt in enumerate(prompts):
        cache = t.new_cache()  # the target's cache holds the prompt but its last token (the anchor)
        _, feats = t.forward(prompt[:-1], cache, d.layer_ids)
        d.commit(feats, r + 1, 0, len(prompt) - 1)
        reqs.append(dict(row=r + 1, cache=cache, prefix=len(prompt) - 1, anchor=prompt[-1], out=[]))
    steps = request_steps = accepted = failed = 0
    while live := [q for q in reqs if len(q["out"]) < max_new]:
        width = widths[steps % len(widths)]
        steps, request_steps = steps + 1, request_steps + len(live)
        batch = d.batch([q["row"] for q in live], [q["prefix"] for q in live], [q["anchor"] for q in live])
        tokens, bad = d.draft(*batch, width)
        prefix = batch[1]
        failed += int(bad.sum())
        verified, feats = [], []
        for q, blk in zip(live, tokens.tolist()):  # linear verify: the block over the request's own cache
            logits, f = t.forward(blk, q["cache"], d.layer_ids)  # [W, V], [W, K*H]
            verified.append(logits.argmax(-1))
            feats.append(f)
        budget = torch.tensor([max_new - len(q["out"]) for q in live], device=dev)
        acc = accept_block(tokens, torch.stack(verified), prefix, budget, stop_table([set()] * len(live), dev))
        accepted += int(acc.accept_lens.sum())
        for q, n, row, f in zip(live, acc.commit_lens.tolist(), acc.out_tokens.tolist(), feats):
            q["out"] += row[:n]
            crop(q["cache"], q["prefix"] + n)  # the anchor and the accepted drafts stay; the rest goes
            d.commit(f, q["row"], q["prefix"], n)
            q["prefix"], q["anchor"] = q["prefix"] + n, q["out"][-1]
    return dict(outputs=[q["out"] for q in reqs], steps=steps, request_steps=request_steps, accepted=accepted,
                draft_failed=failed)  # fmt: skip


def timed_ms(fn, cuda: bool, reps: int) -> float:
    """Median wall time of fn() in ms over reps calls (after one), the device synced around each."""
    fn()
    out = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def sweep_shape(d: Drafting, bs: int, width: int, reps: int, g: torch.Generator) -> dict:
    """One draft shape: a batch of bs requests over random context (prefixes 1 .. max_len - B),
    through the step graphs (captured at first meeting, then replayed) and eagerly: its counts,
    whether the replayed proposals equal the eager ones, and both step times."""
    d.kv.k.normal_(), d.kv.v.normal_()  # context rows: any values
    prefix = torch.randint(1, d.max_len - d.block, (bs,), generator=g).tolist()
    anchors = torch.randint(0, d.target.vocab - 1, (bs,), generator=g).tolist()
    args = d.batch(list(range(1, bs + 1)), prefix, anchors)
    before = Counter(d.graphs.counts)
    got, got_bad = d.draft(*args, width)
    want, want_bad = d.draft(*args, width, graphs=False)
    same = bool(torch.equal(got, want) and torch.equal(got_bad, want_bad))
    graph_ms = timed_ms(lambda: d.draft(*args, width), d.cuda, reps)
    eager_ms = timed_ms(lambda: d.draft(*args, width, graphs=False), d.cuda, reps)
    delta = Counter(d.graphs.counts)
    delta.subtract(before)
    held = any(k[0] == d.graphs.bucket(bs) and k[1] == (width,) for k in d.graphs.entries)
    fallbacks = {k: v for k, v in delta.items() if k.startswith("fallback") and v}
    return dict(bs=bs, width=width, bucket=d.graphs.bucket(bs), held=held, captured=delta["captured"],
                replayed=delta["replayed"], fallbacks=fallbacks, same_as_eager=same, eager_ms=eager_ms,
                graph_ms=graph_ms, ok=held and delta["replayed"] >= 1 + reps and not fallbacks and same)  # fmt: skip
