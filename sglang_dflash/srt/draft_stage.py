"""The worker's draft stage, an object the worker owns: one drafter forward over the block's first
rows (through the step graphs when they are on), the guard that turns a failed draft into a bare
block (that batch decodes one token a request; output stays exact), and the failure count, metric
and short log."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from sglang_dflash import env
from sglang_dflash.pipeline.attention_choice import block_attention
from sglang_dflash.pipeline.draft import Proposal, draft_rows, draft_sampling, propose

logger = logging.getLogger("sglang_dflash")
PROPOSAL = env.PROPOSAL.get()  # DFlash 1 drafts for unseeded sampled rows (env.py)
# Fault injection (tests): make every Nth draft step raise.
DEBUG_FAIL_DRAFT_EVERY = env.DEBUG_FAIL_DRAFT_EVERY.get()


@dataclass
class DraftStage:
    """What a draft step reads: the drafter and its head, the target's embedding, the drafter's
    context KV and SGLang's request -> slot table, and the step graphs (None: eager)."""

    drafter: Any
    head: Callable[[torch.Tensor], torch.Tensor]  # [N, H] -> [N, V] draft logits (srt/draft_head.py)
    embed: Any  # the target's token embedding
    draft_kv: Any  # pipeline/context_kv.DraftKVCache
    req_to_token: torch.Tensor  # [pool rows, context] SGLang's KV slot of each request position
    cfg: Any
    block_size: int
    vocab_size: int
    mask_token_id: int
    cuda: bool
    graphs: Any = None  # pipeline/step_graphs.StepGraphs or None
    metrics: Any = None
    steps: int = 0
    failures: int = 0

    def run(self, req_pool_indices, prefix, slots, block_ids, positions, sampling, width) -> Proposal:
        """The step's draft, guarded: if the drafter fails, the bare block [anchor, MASK...] is
        verified instead."""
        self.steps += 1
        try:
            if DEBUG_FAIL_DRAFT_EVERY and self.steps % DEBUG_FAIL_DRAFT_EVERY == 0:
                raise RuntimeError("injected drafter failure (SGLANG_DFLASH_DEBUG_FAIL_DRAFT_EVERY)")
            return self.draft(req_pool_indices, prefix, slots, block_ids, positions, sampling, width)
        except Exception as e:  # noqa: BLE001 - any drafter fault degrades to plain decoding
            self.failed(f"{type(e).__name__}: {e}", len(prefix))
            return Proposal(block_ids[:, :width])

    def draft(self, req_pool_indices, prefix, slots, block_ids, positions, sampling, width=None) -> Proposal:
        """The drafter over the block's first draft_rows(width) rows -> proposals for its first
        `width` rows (default B). req_pool_indices, prefix [bs]; slots, block_ids, positions [bs, B]
        (cut here to the rows drafted). Under step graphs a batch is
        padded to its bucket with rows that read and write nothing real: the padding slot 0, no
        context (prefix 0), the mask token, greedy. The block attention is planned outside the step
        (FlashInfer's plan is host work a CUDA graph cannot hold) and run inside it."""
        cuda, B = self.cuda, self.block_size
        sel = self.drafter.selector
        rows = draft_rows(width, B, sel)
        slots, block_ids, positions = slots[:, :rows], block_ids[:, :rows], positions[:, :rows]
        k = None if sel is None else min(sel.top_k, self.vocab_size)
        temps, noise, from_q = draft_sampling(sampling, k, rows, PROPOSAL, block_ids.device)
        # host-known (SGLang's requests), so the draft step reads nothing back from the device
        sampled = None if sampling is None or sampling.sampled is None else temps is not None

        def plan(attend, fixed, pool_rows, prefix, slots, **_):  # outside a captured step: host work
            args = (self.cfg, rows, cuda, self.draft_kv, self.req_to_token, pool_rows, prefix, slots.reshape(-1))
            return block_attention(*args, reuse=attend, fixed=fixed)

        def step(attend, pool_rows, prefix, slots, block_ids, positions, temps, noise):
            p = propose(
                self.drafter, attend, self.embed, self.head, block_ids, positions, temps, noise, width, from_q, sampled
            )
            return p.tokens, p.cand_ids, p.q, p.q_rows, p.failed

        args = dict(pool_rows=req_pool_indices, prefix=prefix, slots=slots, block_ids=block_ids, positions=positions)
        args.update(temps=temps, noise=noise)
        if self.graphs is None:
            return Proposal(*step(plan(None, False, **args), **args)).first(width or B)
        pads = dict(pool_rows=0, prefix=0, slots=0, block_ids=self.mask_token_id, positions=0, temps=0.0, noise=0.0)
        out = self.graphs.run(step, args, pads, key=(width, from_q), prepare=plan)
        if self.metrics is not None:
            self.metrics.record_graphs(self.graphs.counts)
        return Proposal(*out).first(width or B)

    def failed(self, why: str, rows: int) -> None:
        self.failures += 1
        if self.metrics is not None:
            self.metrics.draft_failures.inc()
        if self.failures & (self.failures - 1) == 0:  # 1st, 2nd, 4th, 8th...: the log stays short
            logger.warning(
                "DFLASH draft step failed (%s); %d request(s) of this batch decode without a draft "
                "(output stays exact). Failures so far: %d",
                why,
                rows,
                self.failures,
            )
