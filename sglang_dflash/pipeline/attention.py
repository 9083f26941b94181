"""Paged attention in plain torch: the CPU path for block drafting and for target verify.

Both stages attend each request's B query rows to that request's KV rows gathered by slot id:
- drafting: committed context rows from the draft KV + the block's own rows, non-causal;
- verify: the target's prefix rows + the block rows, causal (row r sees prefix + r + 1 keys).
Requests are not looped over: their keys are gathered into one padded [bs, L] slot index and a bool
mask hides the padding (and what causality or a window hides). On CPU the requests are first sorted
by length and cut into a few length groups, one SDPA call each: the CPU SDPA kernel computes masked
keys in full, so padding a 100-key request to 800 keys would cost more than the loop it replaces.
Where the extension is built, verify calls and short draft calls read the rows in place instead
(fused(): chain_attention; SGLANG_DFLASH_CPU_OPS=attention=0 keeps gather + SDPA everywhere).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from sglang_dflash import env, kernels
from sglang_dflash.model.config import MAX_BLOCK_SIZE

# Longest first, a request joins the current length group while padding it to the group's longest
# row adds at most this many keys or this fraction of that row (each extra group: one SDPA call).
PAD_KEYS, PAD_FRAC = 64, 0.2


def attend_rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_prefix: int | None = None
) -> torch.Tensor:
    """q [Q, heads, d]; k, v [K, kv_heads, d] -> [Q, heads, d].

    causal_prefix=None: every query sees every key (DFlash block drafting).
    causal_prefix=P: query i sees keys 0 .. P + i (the Q queries are the last Q of K keys).
    """
    mask = None
    if causal_prefix is not None:
        qpos = torch.arange(q.shape[0], device=q.device)[:, None] + causal_prefix
        mask = torch.arange(k.shape[0], device=q.device)[None, :] <= qpos
    return masked_rows(q, k, v, scale, mask)


def window_mask(prefix: int, block: int, start: int, window: int, device) -> torch.Tensor:
    """Sliding-window visibility for one request's block -> [B, prefix + B - start] bool.

    Keys are the request's positions start .. prefix+B-1; query r sits at position p = prefix + r.
    Convention: a context key j is visible iff j > p - W, i.e. the window is the W positions
    (p - W, p]; block keys are always visible (the block is non-causal). Why: it is the left bound
    z-lab's reference mask and HF Qwen3 apply (query_pos - key_pos < W), so a drafter sees at serving
    what it saw in training. z-lab's non-causal mask also hides block keys W or more rows ahead or
    behind, which exist only when W < B; for W >= B (real drafters: W 2048, B 16) the two agree, and
    so does FlashInfer with window_left = W - 1 (flashinfer_attention.py). batch_mask applies the
    same rule to a whole batch.
    """
    p = prefix + torch.arange(block, device=device)[:, None]
    j = start + torch.arange(prefix + block - start, device=device)[None, :]
    return (j >= prefix) | (j > p - window)


def batch_mask(
    prefix: torch.Tensor,
    block: int,
    width: int,
    start: Optional[torch.Tensor] = None,
    window: Optional[int] = None,
    causal: bool = False,
) -> torch.Tensor:
    """prefix [bs]; start [bs] or None (0) -> [bs, 1, B, width] bool (True: visible), SDPA's layout.

    Column c of request i is its position j = start_i + c; query r sits at p = prefix_i + r. A key
    exists iff j < prefix_i + B (later columns are padding); causal: j <= p (verify); window W:
    window_mask's rule (drafting).
    """
    j = torch.arange(width, device=prefix.device)[None, None, :]  # [1, 1, width]
    if start is not None:
        j = j + start[:, None, None]
    lo = prefix[:, None, None]  # [bs, 1, 1]
    p = lo + torch.arange(block, device=prefix.device)[None, :, None]  # [bs, B, 1]
    mask = j <= p if causal else j < lo + block
    if window is not None:
        mask = mask & ((j >= lo) | (j > p - window))
    return mask.unsqueeze(1)


def masked_rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: Optional[torch.Tensor]
) -> torch.Tensor:
    """q [Q, heads, d]; k, v [K, kv_heads, d]; mask [Q, K] bool (True: visible) or None -> [Q, heads, d]."""
    return batched_rows(q[None], k[None], v[None], scale, None if mask is None else mask[None, None])[0]


def batched_rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: Optional[torch.Tensor]
) -> torch.Tensor:
    """q [bs, Q, heads, d]; k, v [bs, K, kv_heads, d]; mask [bs, 1, Q, K] bool or None -> [bs, Q, heads, d].

    The query heads sharing a KV head are folded into the query length ([bs, kv_heads, group * Q, d]):
    one plain SDPA per KV head instead of the GQA path, which on CPU is 3-6x slower for short Q (a
    width-1 step's single row at batch 16, 257 keys: 3.9 ms -> 0.65 ms per layer)."""
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    bs, rows, heads, d = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    qf = q.transpose(1, 2).reshape(bs, kv_heads, group * rows, d)  # row g * Q + r: head kv*group+g, query r
    if mask is not None and group > 1 and mask.shape[2] != 1:  # a [bs, 1, 1, K] mask broadcasts as is
        mask = mask.repeat(1, 1, group, 1)
    out = F.scaled_dot_product_attention(qf, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale)
    return out.reshape(bs, heads, rows, -1).transpose(1, 2)


# The drafter's block keeps gather + SDPA past 4 rows a request (`make bench-ops`: it won at 8-16); a
# verify takes chain_attention at any width, so its layers run as one call and a row's result does
# not depend on the width verified (its arithmetic is its own in any pass).
FUSED_MAX_ROWS, VERIFY_MAX_ROWS = 4, MAX_BLOCK_SIZE


def fused(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: int, max_rows=FUSED_MAX_ROWS) -> bool:
    """chain_attention serves this call of `rows` query rows a request: CPU, one float dtype
    throughout, at most max_rows rows, the extension built."""
    return (
        rows <= max_rows
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.bfloat16)
        and k_cache.dtype == q.dtype == v_cache.dtype
        and k_cache.shape[-1] == q.shape[-1]
        and env.cpu_op("attention") != "0"
        and kernels.load() == "extension"
    )


def slot_table(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, width: int) -> torch.Tensor:
    """req_to_token [pool, max_len] (row: slot of position 0, 1, ...); req_pool_indices [bs] -> [bs, width] int64.

    Columns past a request's own length hold whatever the pool row holds (stale or 0): still valid
    slot ids, and the masks hide them. width past the row end is cut to the row.
    """
    return req_to_token[req_pool_indices, :width].to(torch.int64)


def gather_rows(cache: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """cache [S, Hkv, D]; idx [bs, L] -> [bs, L, Hkv, D]. index_select, not cache[idx]: on CPU advanced
    indexing copies several times slower (16 vs 2.4 ms for 32 x 816 float32 rows)."""
    return cache.index_select(0, idx.reshape(-1)).view(*idx.shape, *cache.shape[1:])


def length_groups(keys: list[int], exact: bool = False) -> list[tuple[int, int, int]]:
    """keys: each request's key count, longest first -> (first, end, width) row ranges (see PAD_KEYS;
    exact: no padding at all, one group per distinct length)."""
    groups: list[list[int]] = []
    for i, n in enumerate(keys):
        slack = 0 if exact else max(PAD_KEYS, PAD_FRAC * groups[-1][2]) if groups else 0
        if groups and groups[-1][2] - n <= slack:
            groups[-1][1] = i + 1
        else:
            groups.append([i, i + 1, n])
    return [(a, b, w) for a, b, w in groups]


class RowPlan(NamedTuple):
    """What one batch's attention gathers, built once per forward and shared by its layers (drafting:
    TorchBlockAttention; verify, called per layer by SGLang: kept on the forward batch)."""

    order: Optional[torch.Tensor]  # [bs] requests longest first (None: as given)
    inverse: Optional[torch.Tensor]  # [bs] undoes order
    groups: list[tuple[int, int, int]]  # (first, end, width): rows in order, one SDPA call each
    idx: torch.Tensor  # [bs, L] slot ids, rows in order
    mask: Optional[torch.Tensor]  # [bs, 1, B, L]; None: every group sees all its keys (no padding)


def host_lengths(prefix: torch.Tensor) -> Optional[list[int]]:
    """prefix [bs] -> its values when reading them is free (CPU); else None: grouping would cost a device sync."""
    return prefix.tolist() if prefix.is_cpu else None


def plan_rows(
    table: torch.Tensor,
    prefix: torch.Tensor,
    block: int,
    lens: Optional[list[int]],
    window: Optional[int] = None,
    causal: bool = False,
) -> RowPlan:
    """table [bs, T] slot table (T >= max prefix + B); prefix [bs] committed lengths, on table's device;
    lens: the same on the host (see host_lengths), or None: one group of width T, rows as given.
    One verify row per request (B = 1, a plain decode step) sees every key of its request: then the
    groups are cut at exact lengths and SDPA runs unmasked (the masked CPU kernel is the slower one,
    and a width-1 step must cost no more than SGLang's own decode)."""
    start, width = None, table.shape[1]
    exact = block == 1 and window is None and lens is not None
    if window is not None:
        # Keys before prefix - W + 1 are outside every query's window: gather from there, so a long
        # context under a short window costs W - 1 + B columns, not the whole prefix.
        start, width = (prefix - window + 1).clamp(min=0), min(width, window - 1 + block)
    if lens is not None:
        keys = [min(p, window - 1) + block if window is not None else p + block for p in lens]
        order = sorted(range(len(keys)), key=keys.__getitem__, reverse=True)
        groups = length_groups([keys[i] for i in order], exact)
        width = min(width, groups[0][2])
    else:
        order, groups = list(range(table.shape[0])), [(0, table.shape[0], width)]
    perm = inverse = None
    if order != sorted(order):
        perm = torch.tensor(order, device=table.device)
        inverse = torch.empty_like(perm).scatter_(0, perm, torch.arange(len(order), device=perm.device))
        table, prefix = table[perm], prefix[perm]
        start = None if start is None else start[perm]
    if start is None:
        idx = table[:, :width]
    else:  # clamped columns lie past prefix + B: masked
        idx = table.gather(1, (start[:, None] + torch.arange(width, device=start.device)).clamp(max=table.shape[1] - 1))
    mask = None if exact else batch_mask(prefix, block, width, start, window, causal)
    return RowPlan(perm, inverse, groups, idx, mask)


def attend_plan(
    plan: RowPlan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [bs*B, H, D]; k_cache, v_cache [S, Hkv, D] -> [bs*B, H, D]."""
    qs = q.view(plan.idx.shape[0], -1, *q.shape[1:])  # [bs, B, H, D]
    if plan.order is not None:
        qs = qs.index_select(0, plan.order)
    outs = []
    for a, b, w in plan.groups:  # a few length groups, not one call per request
        idx = plan.idx[a:b, :w]
        k, v = gather_rows(k_cache, idx), gather_rows(v_cache, idx)
        mask = None if plan.mask is None else plan.mask[a:b, :, :, :w]
        outs.append(batched_rows(qs[a:b], k, v, scale, mask))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    if plan.inverse is not None:
        out = out.index_select(0, plan.inverse)
    return out.reshape(q.shape)


class TorchBlockAttention:
    """Non-causal DFlash block attention over the paged draft KV, batched over requests (CPU path).

    The block's own K/V rows are first stored at the block's slots (the slots the target reserved
    for verifying it), so every query sees its request's committed context + block. Rows the target
    does not accept are overwritten by later commits before anything reads them as context.
    """

    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        kv_slots: Union[torch.Tensor, Sequence[torch.Tensor]],
        block_slots: torch.Tensor,
        scale: float,
        windows: Sequence[Optional[int]] = (),
        prefix: Optional[torch.Tensor] = None,
    ):
        """k_cache, v_cache [L, S, Hkv, D]; block_slots [bs*B]; windows[layer]: that layer's sliding
        window (None or absent: full). kv_slots is either a slot table [bs, T] (row i: slot of position
        0, 1, ..., T >= max prefix + B, see slot_table) with prefix [bs] committed lengths, or a list
        kv_slots[i] [prefix_i + B] (tests, benches) from which both are built here."""
        if prefix is None:
            lens = [s.numel() for s in kv_slots]
            prefix = torch.tensor(lens, device=block_slots.device) - block_slots.numel() // len(lens)
            kv_slots = pad_sequence([s.to(torch.int64) for s in kv_slots], batch_first=True)  # pads slot 0: masked
        self.k, self.v, self.block_slots, self.scale = k_cache, v_cache, block_slots, scale
        block = block_slots.numel() // kv_slots.shape[0]
        self.windows = [windows[i] if i < len(windows) else None for i in range(k_cache.shape[0])]
        # Built once per draft step, shared by every layer with that window.
        prefix, lens = prefix.to(kv_slots.device), host_lengths(prefix)
        self.table, self.prefix = kv_slots.to(torch.int64), prefix.to(torch.int64)  # the fused op's rows
        self.plans = {w: plan_rows(kv_slots, prefix, block, lens, w) for w in set(self.windows)}

    def __call__(self, layer: int, q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor) -> torch.Tensor:
        """q [bs*B, H, D]; k_blk, v_blk [bs*B, Hkv, D] -> [bs*B, H, D]."""
        kc, vc = self.k[layer], self.v[layer]
        kc.index_copy_(0, self.block_slots, k_blk.to(kc.dtype))
        vc.index_copy_(0, self.block_slots, v_blk.to(vc.dtype))
        if self.windows[layer] is None and fused(q, kc, vc, q.shape[0] // self.table.shape[0]):
            return torch.ops.sglang_dflash.chain_attention(q, kc, vc, self.table, self.prefix, self.scale, False)
        return attend_plan(self.plans[self.windows[layer]], q, kc, vc, self.scale)


def verify_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_slots: torch.Tensor,
    prefix: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each request's B verify rows over its prefix + block (already in cache).

    q [bs*B, heads, d]; k_cache, v_cache [S, kv_heads, d]; kv_slots [bs, T] slot table (see slot_table,
    T >= max prefix + B); prefix [bs] committed lengths -> [bs*B, heads, d].
    """
    return attend_plan(verify_plan(kv_slots, prefix, q.shape[0] // kv_slots.shape[0]), q, k_cache, v_cache, scale)


def verify_plan(kv_slots: torch.Tensor, prefix: torch.Tensor, block: int) -> RowPlan:
    """What verify_attention gathers for kv_slots [bs, T] and prefix [bs]: one plan per forward, every
    layer's attention reads the same rows."""
    return plan_rows(kv_slots, prefix.to(kv_slots.device), block, host_lengths(prefix), causal=True)
