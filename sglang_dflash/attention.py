"""Paged attention in plain torch: the CPU path for block drafting and for target verify.

Both stages attend B query rows of one request to that request's KV rows gathered by slot id:
- drafting: committed context rows from the draft KV + the block's own rows, non-causal;
- verify: the target's prefix rows + the block rows, causal (row i sees prefix + i + 1 keys).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                causal_prefix: int | None = None) -> torch.Tensor:
    """q [Q, heads, d]; k, v [K, kv_heads, d] -> [Q, heads, d].

    causal_prefix=None: every query sees every key (DFlash block drafting).
    causal_prefix=P: query i sees keys 0 .. P + i (the Q queries are the last Q of K keys).
    """
    mask = None
    if causal_prefix is not None:
        qpos = torch.arange(q.shape[0], device=q.device)[:, None] + causal_prefix
        mask = torch.arange(k.shape[0], device=q.device)[None, :] <= qpos
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.squeeze(0).transpose(0, 1)


def block_draft_attention(q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor,
                          k_cache: torch.Tensor, v_cache: torch.Tensor,
                          ctx_slots: list[torch.Tensor], block: int, scale: float) -> torch.Tensor:
    """Non-causal DFlash block attention, batched over requests.

    q [bs*B, heads, d]; k_blk, v_blk [bs*B, kv_heads, d] (the block's own K/V);
    k_cache, v_cache [S, kv_heads, d] (one drafter layer's context KV, indexed by target slot id);
    ctx_slots[i] [ctx_len_i] slot ids of request i's committed tokens.
    """
    out = torch.empty_like(q)
    for i, slots in enumerate(ctx_slots):
        r = slice(i * block, (i + 1) * block)
        k = torch.cat([k_cache[slots], k_blk[r]])
        v = torch.cat([v_cache[slots], v_blk[r]])
        out[r] = attend_rows(q[r], k, v, scale)
    return out


def verify_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     kv_slots: list[torch.Tensor], prefix_lens: list[int], block: int,
                     scale: float) -> torch.Tensor:
    """Causal attention of each request's B verify rows over its prefix + block (already in cache).

    q [bs*B, heads, d]; kv_slots[i] [prefix_i + B] slot ids; prefix_lens[i] committed length.
    """
    out = torch.empty_like(q)
    for i, (slots, p) in enumerate(zip(kv_slots, prefix_lens)):
        r = slice(i * block, (i + 1) * block)
        out[r] = attend_rows(q[r], k_cache[slots], v_cache[slots], scale, causal_prefix=p)
    return out
