"""A dense reference forward of the DFlash drafter for ONE request: the test oracle for drafting.

Independent of the serving path: no paged KV, no slot ids, no attention module. K/V are the plain
concatenation [context; block], RoPE comes from the kernels' reference math, and the sliding
window is masked from absolute positions. DFlash 1 layers only (no dynamic convolutions).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from sglang_dflash.kernels.reference import apply_rope_ref, rope_cos_sin_cache


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [T, heads, D]; pos [T] -> x rotated at pos (neox pairs), in x's dtype."""
    d = x.shape[-1]
    cs = rope_cos_sin_cache(int(pos.max()) + 1, d, theta, x.device)[pos]  # [T, D]: cos | sin
    return apply_rope_ref(x.float(), cs[:, : d // 2], cs[:, d // 2 :], neox=True).to(x.dtype)


def dense_reference(
    model,
    feats: torch.Tensor,
    ctx_pos: torch.Tensor,
    x: torch.Tensor,
    blk_pos: torch.Tensor,
    windows: Sequence[Optional[int]] = (),
) -> torch.Tensor:
    """feats [T, K*H] target features at ctx_pos [T]; x [B, H] embedded block at blk_pos [B]
    -> normed hidden [B, H].

    windows[layer]: sliding window W, the block query at p sees context keys at positions > p - W
    plus the whole block (non-causal); None or absent: every key.
    """
    cfg = model.cfg
    d, hq, hk = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    ctx = model.hidden_norm(model.fc(feats))
    key_pos = torch.cat([ctx_pos, blk_pos])  # [T + B]
    in_block = torch.arange(key_pos.numel()) >= ctx_pos.numel()  # [T + B]
    for i, layer in enumerate(model.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = _rope(a.q_norm(a.q_proj(h).view(-1, hq, d)), blk_pos, cfg.rope_theta)
        k = torch.cat(
            [
                _rope(a.k_norm(a.k_proj(ctx).view(-1, hk, d)), ctx_pos, cfg.rope_theta),
                _rope(a.k_norm(a.k_proj(h).view(-1, hk, d)), blk_pos, cfg.rope_theta),
            ]
        )
        v = torch.cat([a.v_proj(ctx), a.v_proj(h)]).view(-1, hk, d)
        k, v = k.repeat_interleave(hq // hk, 1), v.repeat_interleave(hq // hk, 1)
        logits = torch.einsum("qhd,khd->hqk", q, k) / d**0.5  # [heads, B, T + B]
        window = windows[i] if i < len(windows) else None
        if window is not None:
            visible = in_block[None, :] | (key_pos[None, :] > blk_pos[:, None] - window)  # [B, T + B]
            logits = logits.masked_fill(~visible, float("-inf"))
        o = torch.einsum("hqk,khd->qhd", logits.softmax(-1), v).reshape(x.shape[0], -1)
        x = x + a.o_proj(o)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)
