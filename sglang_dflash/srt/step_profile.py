"""Start-up profile of the decode step cost, cost(bs, W), on the served target and drafter.

Dummy steps at every (profiled batch size, candidate width): for W > 1 one drafter block forward,
then the target's TARGET_VERIFY forward over W rows per request, then greedy acceptance and the
context K/V write, i.e. what a decode step at that width runs. The dummy requests use request-pool
rows that are free at start-up (their token table is all slot 0, SGLang's padding slot, which
every dummy read and write then hits, as CUDA-graph capture does), at a typical prefix length.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import torch

from sglang_dflash import env
from sglang_dflash.pipeline.accept import accept_block
from sglang_dflash.pipeline.block import build_block
from sglang_dflash.pipeline.context_kv import write_context
from sglang_dflash.pipeline.step_cost import CostTable
from sglang_dflash.pipeline.width import WidthController, candidate_widths, load_width_config
from sglang_dflash.srt import profile_cache
from sglang_dflash.srt.metrics import sync
from sglang_dflash.srt.verify_backend import dummy_verify_forward

logger = logging.getLogger("sglang_dflash")

PROFILE_PREFIX = 256  # tokens of context per dummy request
PROFILE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
PROFILE_PASSES = 3


def _width_settings(block: int):
    """(pinned width or None, debug seed or None, debug cycle, candidates by batch size), checked."""
    from sglang.srt.runtime_context import get_spec

    fixed, seed = env.WIDTH.get() or None, env.DEBUG_RANDOM_WIDTH.get()
    if fixed is not None and not 1 <= fixed <= block:
        raise ValueError(f"{env.WIDTH.name}={fixed}: expected 0 (adaptive) or a width in 1..{block} (block size)")
    cycle = [int(w) for w in (env.DEBUG_WIDTH_CYCLE.get() or "").split(",") if w.strip()]
    if any(not 1 <= w <= block for w in cycle):
        raise ValueError(f"{env.DEBUG_WIDTH_CYCLE.name}={cycle}: widths must be in 1..{block} (block size)")
    path = get_spec().speculative_adaptive_config
    widths_for_bs = load_width_config(path, block) if path else {1: candidate_widths(block)}
    return fixed, seed, cycle, widths_for_bs


def _dropped(worker) -> set:
    """The widths whose verify backend failed to build (verify_widths.py): never played."""
    return worker.verify_widths.failed if worker.verify_widths is not None else set()


def _settings(worker):
    """_width_settings less the dropped widths: a pinned or cycled one plays B instead, a candidate
    list left empty holds B (SGLang's own width, always there)."""
    block, dropped = worker.block_size, _dropped(worker)
    fixed, seed, cycle, widths_for_bs = _width_settings(block)
    if dropped:
        fixed = block if fixed in dropped else fixed
        cycle = [block if w in dropped else w for w in cycle]
        widths_for_bs = {k: [w for w in ws if w not in dropped] or [block] for k, ws in widths_for_bs.items()}
    return fixed, seed, cycle, widths_for_bs


def played_widths(worker) -> list[int]:
    """The widths make_controller can choose (start-up builds their verify graphs): the pinned width,
    the debug cycle, or the candidates and 1; the random debug width plays any 1..B (widths not
    listed here verify eagerly)."""
    fixed, _, cycle, widths_for_bs = _settings(worker)
    if fixed is not None:
        return [fixed]
    played = set(cycle) if cycle else {w for ws in widths_for_bs.values() for w in ws} | {1}
    return sorted(played - _dropped(worker))


def make_controller(worker) -> WidthController:
    """The width controller the server runs with: pinned (SGLANG_DFLASH_WIDTH), random (debug), or
    cost-aware over the candidates of --speculative-adaptive-config (default: 1, 2, 4, 8, B)."""
    block = worker.block_size
    fixed, seed, cycle, widths_for_bs = _settings(worker)
    cost = None
    if fixed is None and seed is None and not cycle and env.PROFILE.get():
        max_running = worker.server_args.max_running_requests or 48
        sizes = profile_batch_sizes(min(max_running, worker.model_runner.req_to_token_pool.size - 1))
        cost = profile_cache.cached_costs(worker, played_widths(worker), sizes, profile_costs)
    margin = env.WIDEN_MARGIN.get()
    if margin < 0:
        raise ValueError(f"{env.WIDEN_MARGIN.name}={margin}: expected a margin >= 0 (e.g. 0.05)")
    ctl = WidthController(block, cost, widths_for_bs, fixed=fixed, debug_seed=seed, cycle=cycle, widen_margin=margin)
    dropped = f" (not played, their verify backend failed: {sorted(_dropped(worker))})" if _dropped(worker) else ""
    logger.info("DFLASH verify width: %s, candidates by batch size %s%s", ctl.mode, widths_for_bs, dropped)
    return ctl


def profile_batch_sizes(max_running: int) -> list[int]:
    sizes = [b for b in PROFILE_BATCHES if b <= max_running]
    return sizes + ([max_running] if max_running not in sizes and max_running < PROFILE_BATCHES[-1] else [])


def profile_costs(
    worker,
    widths: list[int],
    batch_sizes: list[int],
    passes: int = PROFILE_PASSES,
    budget_s: float | None = None,
    step=None,
    clock=time.perf_counter,
) -> CostTable:
    """The fastest of `passes` timed dummy steps per (bs, W), after one warm-up step per bs at the
    widest W (the first call of a shape pays one-off allocations); the online correction refines it
    from real steps. The first pass runs row by row, smallest bs first, and stops before a row that
    would pass the time budget (SGLANG_DFLASH_PROFILE_BUDGET): larger batches are then extrapolated
    linearly by the table (an unbounded profile can outlast a health check's patience). The later
    passes are interleaved over the whole measured grid (a pass per cell in a row lets one slow
    stretch of the host inflate a whole cell) and run while the budget lasts. The result is cached
    per host, model and settings (profile_cache.py)."""
    step = step or _dummy_step
    budget_s = env.PROFILE_BUDGET.get() if budget_s is None else budget_s
    seconds, measured = {}, []
    t0 = clock()
    for i, bs in enumerate(batch_sizes):
        row_start = clock()
        step(worker, bs, widths[-1])
        for w in widths:
            seconds[(bs, w)] = step(worker, bs, w)
        measured.append(bs)
        row = clock() - row_start
        nxt = batch_sizes[i + 1] if i + 1 < len(batch_sizes) else None
        if nxt is not None and clock() - t0 + row * nxt / bs > budget_s:
            break
    first_pass = clock() - t0
    done = 1
    while done < passes and clock() - t0 + first_pass <= budget_s:
        for bs in measured:
            for w in widths:
                seconds[(bs, w)] = min(seconds[(bs, w)], step(worker, bs, w))
        done += 1
    table = CostTable(measured, widths, seconds)
    beyond = f"; bs > {measured[-1]} extrapolated (budget {budget_s:g} s)" if measured != list(batch_sizes) else ""
    logger.info(
        "DFLASH step cost profile (%.1f s, prefix %d, fastest of %d passes%s; ms per step, forced monotone):\n%s",
        clock() - t0,
        PROFILE_PREFIX,
        done,
        beyond,
        table.describe(),
    )
    return table


@torch.inference_mode()
def _dummy_step(worker, bs: int, width: int) -> float:
    runner = worker.model_runner
    dev = worker.device
    prefix = torch.full((bs,), min(PROFILE_PREFIX, runner.model_config.context_len - worker.block_size), device=dev)
    pool_rows = torch.arange(bs, device=dev)
    anchor = torch.zeros(bs, dtype=torch.int64, device=dev)
    block_ids, positions = build_block(anchor, prefix, worker.block_size, worker.mask_token_id)
    slots = torch.zeros_like(block_ids)  # padding slot
    batch = SimpleNamespace(req_pool_indices=pool_rows, seq_lens=prefix)
    sync(worker.device_type)
    start = time.perf_counter()
    draft = block_ids[:, :width]
    if width > 1:
        draft = worker.drafting.draft(batch.req_pool_indices, prefix, slots, block_ids, positions, None, width).tokens
    out = dummy_verify_forward(
        worker._target_worker, draft, positions[:, :width], slots[:, :width], pool_rows, prefix, worker.verify_widths
    )
    tokens = out.next_token_logits.argmax(-1).view(bs, width)
    budget = torch.full((bs,), 1 << 30, dtype=torch.int64, device=dev)
    acc = accept_block(draft, tokens, prefix, budget, torch.full((bs, 1), -1, dtype=torch.int64, device=dev))
    rows = acc.committed_rows()
    write_context(
        worker.drafter,
        worker.draft_kv,
        out.hidden_states[rows],
        positions[:, :width].reshape(-1)[rows],
        slots[:, :width].reshape(-1)[rows],
    )
    sync(worker.device_type)
    return time.perf_counter() - start
