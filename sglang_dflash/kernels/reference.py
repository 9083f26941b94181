"""Pure-torch references of the csrc/ ops (the specification the C++/CUDA kernels are tested against).

write_draft_kv: k_norm + RoPE on the context K of every drafter layer, then store K and V into the
    drafter's KV buffers at the target's slot ids (one call for all layers).
linear_verify_accept: longest matching prefix + bonus, cut by each request's token budget and
    stop tokens, in one call for the batch.
bf16_linear: x @ W^T (+ b) of bf16 tensors, summed in fp32 and rounded to bf16 once (CPU only).
pack_linear / unpack_linears / packed_linear: F.linear, on a weight packed once for oneDNN where the
    extension packed it (CPU only; without it nothing is packed).
rope_qk: SGLang's RotaryEmbedding.forward_native, bit for bit in bf16 (CPU only).
chain_attention: B rows per request over its paged KV, causal (the target's verify) or not (the
    drafter's block) (CPU only).
cpu_isa: (the ISA level the CPU kernels dispatch on, the CPU's own), from /proc/cpuinfo's flags and
    SGLANG_DFLASH_CPU_ISA (the extension asks the CPU itself: csrc/cpu/cpu_features.h).
"""

from __future__ import annotations

import torch


def rope_cos_sin_cache(max_pos: int, head_dim: int, theta: float, device="cpu") -> torch.Tensor:
    """[max_pos, head_dim] float32: cos in the first half, sin in the second (SGLang's layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    freqs = torch.arange(max_pos, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """x [..., T, H, D] float32; cos/sin [T, D/2] -> rotated x. neox pairs (i, i+D/2); else (2i, 2i+1)."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    if neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def write_draft_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_norm_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    eps: float,
    neox: bool = True,
    kv_scale: float = 1.0,
) -> None:
    """k, v [L, T, Hkv, D]; k_norm_weight [L, D]; cos_sin_cache [P, D]; positions, slots [T] int64;
    k_cache, v_cache [L, S, Hkv, D] (S = pages * page_size, any dtype incl. float8_e4m3fn), mutated.
    fp8 caches store value / kv_scale."""
    if slots.numel() == 0:
        return
    # Same bounds and messages as csrc/dflash_checks.h (torch indexing would wrap a negative slot).
    S, P = k_cache.shape[1], cos_sin_cache.shape[0]
    s_lo, s_hi, p_lo, p_hi = torch.stack([slots.min(), slots.max(), positions.min(), positions.max()]).tolist()
    if s_lo < 0 or s_hi >= S:
        raise RuntimeError(
            f"write_draft_kv: slot {s_lo if s_lo < 0 else s_hi} out of range [0, {S}): the KV pool has {S} slots"
        )
    if p_lo < 0 or p_hi >= P:
        raise RuntimeError(
            f"write_draft_kv: position {p_lo if p_lo < 0 else p_hi} out of range [0, {P}): cos_sin_cache has {P} rows"
        )
    kf = k.float()
    kf = kf * torch.rsqrt(kf.pow(2).mean(-1, keepdim=True) + eps) * k_norm_weight.float()[:, None, None, :]
    cs = cos_sin_cache[positions].float()
    half = cs.shape[-1] // 2
    kf = apply_rope_ref(kf, cs[:, :half], cs[:, half:], neox)
    vf = v.float()
    if k_cache.dtype == torch.float8_e4m3fn:
        kf, vf = kf / kv_scale, vf / kv_scale
    k_cache[:, slots] = kf.to(k_cache.dtype)
    v_cache[:, slots] = vf.to(v_cache.dtype)


def linear_verify_accept_ref(
    draft: torch.Tensor, target: torch.Tensor, prefix_lens: torch.Tensor, budget: torch.Tensor, stop_ids: torch.Tensor
):
    """draft, target [bs, B] int64 (target[i, j] = the target's token after block position j);
    prefix_lens, budget [bs] int64 (budget = tokens the request may still emit, >= 1);
    stop_ids [bs, S] int64 padded with -1.
    Returns accept_lens [bs] (drafts accepted), bonus [bs] (the last emitted token, the next block's
    anchor: target[commit - 1]), commit_lens [bs] (tokens emitted: accept + 1, cut at the budget and
    just after the first stop token), new_seq_lens [bs], out_tokens [bs, B] (target tokens; -1 past
    commit_lens). All int64."""
    bs, B = draft.shape
    match = (draft[:, 1:] == target[:, :-1]).to(torch.int64)
    accept = match.cumprod(dim=1).sum(dim=1)
    commit = torch.minimum(accept + 1, budget.clamp(min=1))
    is_stop = (target[:, :, None] == stop_ids[:, None, :]).any(-1)  # padding -1 never matches
    cols = torch.arange(B, device=draft.device)[None, :]
    first_stop = torch.where(is_stop, cols, B).min(dim=1).values
    commit = torch.minimum(commit, first_stop + 1)
    bonus = target.gather(1, (commit - 1)[:, None]).squeeze(1)
    out = torch.where(cols < commit[:, None], target, torch.full_like(target, -1))
    return accept, bonus, commit, prefix_lens + commit, out


def pack_linear_ref(weight: torch.Tensor, rows: int) -> bool:
    """No packing without the extension: every packed_linear is F.linear."""
    return False


def unpack_linears_ref() -> int:
    return 0


def packed_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ weight [out, in]^T (+ bias): what oneDNN computes on the packed weight, bit for bit."""
    return torch.nn.functional.linear(x, weight, bias)


def bf16_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] bf16, weight [N, K] bf16, bias [N] bf16 or None -> [..., N] bf16: the product and
    the bias summed in fp32, rounded to bf16 once (what torch's bf16 linear computes)."""
    y = x.float() @ weight.float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(torch.bfloat16)


def rope_qk_ref(positions, query, key, cos_sin_cache, head_size: int, neox: bool):
    """SGLang's RotaryEmbedding.forward_native: positions [T]; query, key [T, heads * head_size] (or
    [T, heads, head_size]); cos_sin_cache [max_pos, rotary_dim] (cos | sin) -> rotated (query, key),
    cos/sin cast to the query's dtype and every op rounded to it, as torch computes it op by op."""
    cos, sin = cos_sin_cache.index_select(0, positions.flatten()).chunk(2, dim=-1)
    rd = cos_sin_cache.shape[-1]

    def rotate(x):
        shape = x.shape
        x = x.reshape(positions.numel(), -1, head_size)
        c, s = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
        rot = x[..., :rd]
        x1, x2 = rot.chunk(2, dim=-1) if neox else (rot[..., ::2], rot[..., 1::2])
        o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
        out = torch.cat((o1, o2), -1) if neox else torch.stack((o1, o2), -1).flatten(-2)
        return torch.cat((out, x[..., rd:]), -1).reshape(shape)

    return rotate(query), rotate(key)


def chain_attention_ref(q, k_cache, v_cache, slots, prefix, scale: float, causal: bool):
    """q [bs*B, H, D]; k_cache, v_cache [S, Hkv, D]; slots [bs, T] slot ids by position; prefix [bs]
    -> [bs*B, H, D]: row r of request i attends to positions 0 .. prefix[i] + r (causal) or
    0 .. prefix[i] + B - 1, in float32, rounded to q's dtype once."""
    bs = slots.shape[0]
    if bs == 0 or q.shape[0] == 0:
        return torch.empty_like(q)
    block, heads = q.shape[0] // bs, q.shape[1]
    group = heads // k_cache.shape[1]
    out = []
    for i in range(bs):
        n = int(prefix[i]) + block
        k = k_cache[slots[i, :n]].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, n, D]
        v = v_cache[slots[i, :n]].float().repeat_interleave(group, dim=1).transpose(0, 1)
        qi = q[i * block : (i + 1) * block].float().transpose(0, 1)  # [H, B, D]
        s = (qi * scale) @ k.transpose(1, 2)  # [H, B, n]
        seen = torch.arange(n)[None, :] <= int(prefix[i]) + torch.arange(block)[:, None]  # [B, n]
        seen = seen if causal else torch.ones_like(seen)
        p = torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1)
        out.append((p @ v).transpose(0, 1))  # [B, H, D]
    return torch.cat(out).to(q.dtype)


def rms_norm_ref(x, residual, weight, eps: float):
    """SGLang's RMSNorm.forward_native (no fp32 residual, no variance override, weight applied in
    fp32): x [..., H]; residual None or x's shape; weight [H] -> (normed [..., H] in x's dtype,
    x + residual in x's dtype, or an empty tensor without residual)."""
    dtype = x.dtype
    x = x.contiguous().to(torch.float32)
    res = x.new_empty(0, dtype=dtype)
    if residual is not None:
        x = x + residual.to(torch.float32)
        res = x.to(dtype)
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x * weight).to(dtype), res


def llama_layer_ref(h, residual, positions, ln1, qkv_w, qkv_b, o_w, ln2, gate_up_w, down_w, cos_sin_cache,
                    k_cache, v_cache, out_loc, slots, prefix, num_heads: int, num_kv_heads: int, head_size: int,
                    eps: float, scale: float, neox: bool, gemm_rows: int = 2**62):  # fmt: skip
    """One Llama decoder layer from the other ops' references, in the order SGLang's layer runs them:
    h, residual [T, hidden] (residual None at layer 0: the embeddings are the residual stream);
    k_cache, v_cache [S, Hkv, D] written at out_loc [T] -> (h_out, residual after the input norm's
    add, residual after the post-attention norm's add), each [T, hidden]. gemm_rows: the kernel picks
    its GEMM by rows (ours or torch's); both are one bf16 rounding of the same product, as here."""
    x, res_mid = rms_norm_ref(h, residual, ln1, eps)
    if residual is None:
        res_mid = h
    q_size, kv_size = num_heads * head_size, num_kv_heads * head_size
    q, k, v = bf16_linear_ref(x, qkv_w, qkv_b).split([q_size, kv_size, kv_size], dim=-1)
    q, k = rope_qk_ref(positions, q, k, cos_sin_cache, head_size, neox)
    k_cache[out_loc.long()] = k.reshape(-1, num_kv_heads, head_size)
    v_cache[out_loc.long()] = v.reshape(-1, num_kv_heads, head_size)
    attn = chain_attention_ref(q.reshape(-1, num_heads, head_size), k_cache, v_cache, slots, prefix, scale, True)
    x2, res_out = rms_norm_ref(bf16_linear_ref(attn.reshape(h.shape[0], q_size), o_w, None), res_mid, ln2, eps)
    gu = bf16_linear_ref(x2, gate_up_w, None)
    d = gu.shape[-1] // 2
    return bf16_linear_ref(torch.nn.functional.silu(gu[..., :d]) * gu[..., d:], down_w, None), res_mid, res_out


ISA_LEVELS = ("scalar", "avx2", "avx512", "avx512bf16", "amx")  # csrc/cpu/cpu_features.h's levels, in order
# /proc/cpuinfo flags each level adds to the one below it
ISA_FLAGS = ((), ("avx2", "fma"), ("avx512f",), ("avx512bw", "avx512_bf16"), ("amx_tile", "amx_bf16"))


def cpu_isa_ref() -> tuple[int, int]:
    from sglang_dflash import env

    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        flags = []
    detected = 0
    while detected + 1 < len(ISA_LEVELS) and all(f in flags for f in ISA_FLAGS[detected + 1]):
        detected += 1
    cap = env.CPU_ISA.get()
    return min(detected, ISA_LEVELS.index(cap) if cap != "auto" else detected), detected
