"""The DFlash drafter: Qwen3-style decoder layers with no embedding and no LM head of their own.

Plain torch. The target's embedding and LM head are borrowed by the caller (see draft.py).
Attention is delegated to a callable so the same layers run over the paged draft KV on any device.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from sglang_dflash.model.config import DrafterConfig
from sglang_dflash.model.dynamic_conv import FINISH, PREPARE, DynamicConv
from sglang_dflash.model.rope import apply_rope, grow_for, rope_cos_sin, rope_table
from sglang_dflash.model.selector import CandidateSelector


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(dtype)


class DrafterAttention(nn.Module):
    matmul = staticmethod(F.linear)  # x [N, in], w [out, in] -> [N, out]; serving may route it (route_matmuls)

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def context_kv(self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """ctx [T, H] projected context -> K, V [T, kv_heads, head_dim] (k_norm + RoPE on K)."""
        t = ctx.shape[0]
        k = self.k_norm(self.k_proj(ctx).view(t, self.num_kv_heads, self.head_dim))
        v = self.v_proj(ctx).view(t, self.num_kv_heads, self.head_dim)
        return apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos, sin, attend) -> torch.Tensor:
        """x [N, H] block rows (N = bs * B); attend(q, k_blk, v_blk) -> [N, heads, head_dim]."""
        n = x.shape[0]
        if hasattr(self, "qkv_weight"):  # fused (fuse_projections): one matmul instead of three
            nq, nkv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            q, k, v = self.matmul(x, self.qkv_weight).split([nq, nkv, nkv], dim=-1)
            k = apply_rope(self.k_norm(k.reshape(n, self.num_kv_heads, self.head_dim)), cos, sin)
            v = v.reshape(n, self.num_kv_heads, self.head_dim)
        else:
            q = self.q_proj(x)
            k, v = self.context_kv(x, cos, sin)
        q = apply_rope(self.q_norm(q.reshape(n, self.num_heads, self.head_dim)), cos, sin)
        out = attend(q, k, v)
        return self.matmul(out.reshape(n, self.num_heads * self.head_dim), self.o_proj.weight)


class DrafterMLP(nn.Module):
    matmul = staticmethod(F.linear)  # as DrafterAttention.matmul

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        if hasattr(self, "gate_up_weight"):  # fused (fuse_projections)
            gate, up = self.matmul(x, self.gate_up_weight).chunk(2, dim=-1)
            return self.matmul(F.silu(gate) * up, self.down_proj.weight)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def fuse_rows(*linears: nn.Linear) -> torch.Tensor:
    """Stack the linears' weights [out_i, H] into one [sum out_i, H] and make each weight a view of
    its rows: one matmul where there were several, no second copy, and anything later written into
    a weight (load_state_dict copies in place) lands in the fused tensor too."""
    fused = torch.cat([m.weight.data for m in linears])
    row = 0
    for m in linears:
        m.weight.data = fused[row : row + m.weight.shape[0]]
        row += m.weight.shape[0]
    return fused


def block_prefix(x: torch.Tensor, block: int, keep: int) -> torch.Tensor:
    """x [N, H] rows in consecutive blocks of `block` -> [N * keep / block, H]: each block's first `keep`."""
    return x.view(-1, block, x.shape[-1])[:, :keep].reshape(-1, x.shape[-1])


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DrafterAttention(cfg)
        self.mlp = DrafterMLP(cfg)
        d2 = cfg.dflash2
        if d2 is not None and d2.uses_conv:  # DFlash 2: dynamic convolutions around both sublayers
            self.attention_conv = DynamicConv(cfg.hidden_size, d2.conv_kernel_size, d2.conv_group_size)
            self.mlp_conv = DynamicConv(cfg.hidden_size, d2.conv_kernel_size, d2.conv_group_size)

    def forward(self, x, cos, sin, attend, block: int | None = None, keep: int | None = None):
        """x [N, H] rows in consecutive blocks of `block` (needed by DFlash 2's convolutions).
        keep: after attention only the first `keep` rows of each block go on (the last layer of a
        step that reads `keep` rows): rows never mix after attention, so the kept rows are unchanged
        and the MLP runs on keep/block of the rows. -> [N * keep / block, H]."""
        x = x + self._sublayer(
            self.input_layernorm(x),
            getattr(self, "attention_conv", None),
            block,
            lambda h: self.self_attn(h, cos, sin, attend),
        )
        if keep is not None and block is not None and keep < block:  # convolutions look back only: a prefix is whole
            x, block = block_prefix(x, block, keep), keep
        return x + self._sublayer(self.post_attention_layernorm(x), getattr(self, "mlp_conv", None), block, self.mlp)

    @staticmethod
    def _sublayer(h, conv, block, fn):
        if conv is None:
            return fn(h)
        if block is None:
            raise ValueError("a DFlash 2 drafter needs the block size to run its convolutions")
        coef = conv.coefficients(h)  # [N, 2, taps, H]
        return conv.convolve(fn(conv.convolve(h, coef[:, PREPARE], block)), coef[:, FINISH], block)


class DFlashDrafter(nn.Module):
    """Weights named as in z-lab checkpoints: layers.N.*, norm, fc, hidden_norm."""

    matmul = staticmethod(F.linear)  # as DrafterAttention.matmul

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = nn.Linear(cfg.num_context_layers * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        d2 = cfg.dflash2
        if d2 is not None:  # DFlash 2: path selector over the top-k candidates per block position
            self.candidate_selector = CandidateSelector(
                cfg.hidden_size,
                cfg.vocab_size,
                d2.selector_rank,
                d2.selector_top_k,
                d2.output_multiplier,
                d2.final_logit_softcapping,
                d2.selector_walk,
            )

        if cfg.draft_vocab_size:  # reduced draft vocabulary: draft index i is target token i + d2t[i]
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))

    def to_target(self, idx: torch.Tensor) -> torch.Tensor:
        """Indices into the drafter's vocabulary -> target token ids (identity without d2t)."""
        d2t = getattr(self, "d2t", None)
        return idx if d2t is None else idx + d2t[idx]

    @property
    def selector(self) -> CandidateSelector | None:
        return getattr(self, "candidate_selector", None)

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        """features [T, K*H] (target hidden states at target_layer_ids) -> context [T, H]."""
        return self.hidden_norm(self.matmul(features.to(self.fc.weight.dtype), self.fc.weight))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor):
        """features [T, K*H], positions [T] -> K, V [L, T, kv_heads, head_dim] for every layer
        (k_norm and RoPE applied; the fused op in projection.py does the same in one call)."""
        ctx = self.project_features(features)
        grow_for(positions, self.cfg.block_size, self.cfg.head_dim, self.cfg.rope_theta)  # and the next block's
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        ks, vs = zip(*(layer.self_attn.context_kv(ctx, cos, sin) for layer in self.layers))
        return torch.stack(ks), torch.stack(vs)

    def context_kv_pre(self, features: torch.Tensor):
        """features [T, K*H] -> K before k_norm/RoPE, V: [L, T, kv_heads, head_dim] each, in one matmul."""
        ctx = self.project_features(features)
        if getattr(self, "_kv_weight", None) is None:  # weights are frozen: stack once
            self._kv_weight = torch.cat(
                [torch.cat([layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight]) for layer in self.layers]
            )
            self._k_norm_weight = torch.stack([layer.self_attn.k_norm.weight for layer in self.layers])
        c = self.cfg
        kv = self.matmul(ctx, self._kv_weight).view(-1, c.num_layers, 2, c.num_kv_heads, c.head_dim)
        kv = kv.permute(2, 1, 0, 3, 4).contiguous()
        return kv[0], kv[1]

    def fuse_projections(self) -> "DFlashDrafter":
        """Serving: q/k/v and gate/up each in one matmul (small-M bf16 GEMMs on CPU pay per call;
        measured in bench/draft_head_bench.py). The math is unchanged; the training model is not fused.
        Call it last: the fused tensors are plain attributes, which a later .to() would not move."""
        for layer in self.layers:
            attn = layer.self_attn
            attn.qkv_weight = fuse_rows(attn.q_proj, attn.k_proj, attn.v_proj)
            layer.mlp.gate_up_weight = fuse_rows(layer.mlp.gate_proj, layer.mlp.up_proj)
        return self

    def route_matmuls(self, matmul) -> "DFlashDrafter":
        """Serving: every projection of the block forward and the context write (not the DFlash 2
        selector's or convolutions') through matmul(x [N, in], w [out, in]) -> [N, out], e.g. the CPU
        GEMM kernel the target's layers run on. Drafts only: a different rounding never changes a token."""
        for m in self.modules():
            if isinstance(m, (DrafterAttention, DrafterMLP, DFlashDrafter)):
                m.matmul = matmul
        return self

    def rope_table(self, max_pos: int, device) -> torch.Tensor:
        """[P >= max_pos + block_size, head_dim] float32 cos|sin table: the shared one in rope.py (the
        fused write's), covering positions below max_pos and the block drafted after them. A server
        calls it once at start-up with its context length: draft steps never size it (rope.py)."""
        return rope_table(max_pos + self.cfg.block_size, self.cfg.head_dim, self.cfg.rope_theta, device)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, attend, block: int | None = None, keep: int | None = None
    ) -> torch.Tensor:
        """x [N, H] embedded block rows (consecutive blocks of `block`), positions [N] -> normed hidden [N, H]
        ([N * keep / block, H]: only the first `keep` rows of each block, cut in the last layer).

        attend(layer_index, q, k_blk, v_blk): attention over context + block, non-causal.
        Reads nothing back from the device (a CUDA graph captures it): RoPE rows come from the table
        sized before the step (rope_table / context_kv).
        """
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, functools.partial(attend, i), block, keep if i == last else None)
        return self.norm(x)
