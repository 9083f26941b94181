"""Paged attention in plain torch: the CPU path for block drafting and for target verify.

Both stages attend B query rows of one request to that request's KV rows gathered by slot id:
- drafting: committed context rows from the draft KV + the block's own rows, non-causal;
- verify: the target's prefix rows + the block rows, causal (row i sees prefix + i + 1 keys).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F


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
    so does FlashInfer with window_left = W - 1 (flashinfer_attention.py).
    """
    p = prefix + torch.arange(block, device=device)[:, None]
    j = start + torch.arange(prefix + block - start, device=device)[None, :]
    return (j >= prefix) | (j > p - window)


def masked_rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: Optional[torch.Tensor]
) -> torch.Tensor:
    """q [Q, heads, d]; k, v [K, kv_heads, d]; mask [Q, K] bool (True: visible) or None -> [Q, heads, d]."""
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


class TorchBlockAttention:
    """Non-causal DFlash block attention over the paged draft KV, one request at a time (CPU path).

    The block's own K/V rows are first stored at the block's slots (the slots the target reserved
    for verifying it), so every query sees kv_slots[i] = committed context + block. Rows the target
    does not accept are overwritten by later commits before anything reads them as context.
    """

    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        kv_slots: list[torch.Tensor],
        block_slots: torch.Tensor,
        scale: float,
        windows: Sequence[Optional[int]] = (),
    ):
        """k_cache, v_cache [L, S, Hkv, D]; kv_slots[i] [prefix_i + B], slot of position 0, 1, ...;
        block_slots [bs*B]; windows[layer]: that layer's sliding window (None or absent: full)."""
        self.k, self.v, self.kv_slots, self.block_slots, self.scale = k_cache, v_cache, kv_slots, block_slots, scale
        self.windows = list(windows)

    def __call__(self, layer: int, q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor) -> torch.Tensor:
        """q [bs*B, H, D]; k_blk, v_blk [bs*B, Hkv, D] -> [bs*B, H, D]."""
        kc, vc = self.k[layer], self.v[layer]
        kc.index_copy_(0, self.block_slots, k_blk.to(kc.dtype))
        vc.index_copy_(0, self.block_slots, v_blk.to(vc.dtype))
        block = q.shape[0] // len(self.kv_slots)
        window = self.windows[layer] if layer < len(self.windows) else None
        out = torch.empty_like(q)
        for i, slots in enumerate(self.kv_slots):
            r = slice(i * block, (i + 1) * block)
            if window is None:
                out[r] = attend_rows(q[r], kc[slots], vc[slots], self.scale)
                continue
            prefix = slots.numel() - block  # kv_slots[i][j] holds position j: the context is the whole prefix
            start = max(0, prefix - window + 1)  # older keys are outside every query's window: skip them
            mask = window_mask(prefix, block, start, window, q.device)
            out[r] = masked_rows(q[r], kc[slots[start:]], vc[slots[start:]], self.scale, mask)
        return out


def verify_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_slots: list[torch.Tensor],
    prefix_lens: list[int],
    block: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each request's B verify rows over its prefix + block (already in cache).

    q [bs*B, heads, d]; kv_slots[i] [prefix_i + B] slot ids; prefix_lens[i] committed length.
    """
    out = torch.empty_like(q)
    for i, (slots, p) in enumerate(zip(kv_slots, prefix_lens)):
        r = slice(i * block, (i + 1) * block)
        out[r] = attend_rows(q[r], k_cache[slots], v_cache[slots], scale, causal_prefix=p)
    return out
