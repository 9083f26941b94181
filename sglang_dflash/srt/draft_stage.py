"""The worker's draft stage: one drafter forward over the block (through the step graphs when they
are on), and what a failed draft step leaves behind (a count, a metric, a short log)."""

from __future__ import annotations

import logging

from sglang_dflash import env
from sglang_dflash.pipeline.attention_choice import block_attention
from sglang_dflash.pipeline.draft import Proposal, draft_rows, draft_sampling, propose

logger = logging.getLogger("sglang_dflash")
PROPOSAL = env.PROPOSAL.get()  # DFlash 1 drafts for unseeded sampled rows (env.py)


def draft_step(w, req_pool_indices, prefix, slots, block_ids, positions, sampling, width=None) -> Proposal:
    """Worker w's drafter over the block's first draft_rows(width) rows -> proposals for its first
    `width` rows (default B). req_pool_indices, prefix [bs]; slots, block_ids, positions [bs, B]
    (cut here to the rows drafted). Under step graphs a batch is
    padded to its bucket with rows that read and write nothing real: the padding slot 0, no
    context (prefix 0), the mask token, greedy. The block attention is planned outside the step
    (FlashInfer's plan is host work a CUDA graph cannot hold) and run inside it."""
    req_to_token = w.model_runner.req_to_token_pool.req_to_token
    cuda, B = w.device_type == "cuda", w.block_size
    sel = w.drafter.selector
    rows = draft_rows(width, B, sel)
    slots, block_ids, positions = slots[:, :rows], block_ids[:, :rows], positions[:, :rows]
    k = None if sel is None else min(sel.top_k, w.vocab_size)
    temps, noise, from_q = draft_sampling(sampling, k, rows, PROPOSAL, block_ids.device)
    # host-known (SGLang's requests), so the draft step reads nothing back from the device
    sampled = None if sampling is None or sampling.sampled is None else temps is not None
    embed = w.model_runner.model.model.embed_tokens

    def plan(attend, fixed, pool_rows, prefix, slots, **_):  # outside a captured step: host work
        args = (w.cfg, rows, cuda, w.draft_kv, req_to_token, pool_rows, prefix, slots.reshape(-1))
        return block_attention(*args, reuse=attend, fixed=fixed)

    def step(attend, pool_rows, prefix, slots, block_ids, positions, temps, noise):
        p = propose(w.drafter, attend, embed, w.draft_head, block_ids, positions, temps, noise, width, from_q, sampled)
        return p.tokens, p.cand_ids, p.q, p.q_rows, p.failed

    args = dict(pool_rows=req_pool_indices, prefix=prefix, slots=slots, block_ids=block_ids, positions=positions)
    args.update(temps=temps, noise=noise)
    if w.graphs is None:
        return Proposal(*step(plan(None, False, **args), **args)).first(width or B)
    pads = dict(pool_rows=0, prefix=0, slots=0, block_ids=w.mask_token_id, positions=0, temps=0.0, noise=0.0)
    out = w.graphs.run(step, args, pads, key=(width, from_q), prepare=plan)
    if w.metrics is not None:
        w.metrics.record_graphs(w.graphs.counts)
    return Proposal(*out).first(width or B)


def draft_failed(w, why: str, rows: int) -> None:
    w.draft_failures += 1
    if w.metrics is not None:
        w.metrics.draft_failures.inc()
    if w.draft_failures & (w.draft_failures - 1) == 0:  # 1st, 2nd, 4th, 8th...: the log stays short
        logger.warning(
            "DFLASH draft step failed (%s); %d request(s) of this batch decode without a draft "
            "(output stays exact). Failures so far: %d",
            why,
            rows,
            w.draft_failures,
        )
