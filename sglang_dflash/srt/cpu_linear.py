"""The target's bf16 GEMMs and rotary embedding on a CPU without native bf16, through our
`bf16_linear` and `rope_qk` ops.

torch's bf16 matmul on an AVX2-only host runs at ~10 GFLOP/s a core at every shape (bench/
step_profile.py: 60-85% of a served step), while fp32 FMAs on bf16 weights widened in registers run
several times faster and read half the bytes of fp32 weights (csrc/bf16_linear_cpu.cpp). The DFLASH
worker turns this on at start-up (`enable`) for a bf16 target on such a host; SGLang's linear layers
and LM head then call the op, its rotary embeddings the fused one (one pass instead of ~25 torch
ops a layer, bit-identical: ~8% of a width-1 step, bench/step_profile.py). A plain server (no
DFLASH worker) is left as SGLang made it.
SGLANG_DFLASH_CPU_LINEAR: auto (on where oneDNN has no native bf16), 1 (on for any bf16 CPU target),
0 (off).
"""

from __future__ import annotations

import torch

from sglang_dflash import env

_state = {"on": False}
# rope_qk's scalar pass wins up to here; past it torch's vectorized ops do (bench/ops_bench.py, the
# embedded target's heads: 8.6x at 1 token, 2.7x at 16, 1.26x at 48, 1.09x at 64, 0.7x at 128).
ROPE_MAX_TOKENS = 48


def wanted(device_type: str, dtype: torch.dtype) -> bool:
    mode = env.CPU_LINEAR.get()
    if device_type != "cpu" or dtype != torch.bfloat16 or mode == "0":
        return False
    if mode == "1":
        return True
    return not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def enable(device_type: str, dtype: torch.dtype) -> bool:
    """Route this process's bf16 CPU GEMMs to bf16_linear when wanted; returns whether it is on."""
    from sglang_dflash import kernels

    _state["on"] = wanted(device_type, dtype) and kernels.load() == "extension"
    return _state["on"]


def _eligible(x: torch.Tensor, w, bias) -> bool:
    return (
        _state["on"]
        and isinstance(w, torch.Tensor)
        and x.device.type == "cpu"
        and x.dtype == torch.bfloat16
        and w.dtype == torch.bfloat16
        and w.dim() == 2
        and (bias is None or bias.dtype == torch.bfloat16)
    )


def linear_apply(original, self, layer, x, bias=None):
    """AROUND UnquantizedLinearMethod.apply (its last branch is F.linear on CPU)."""
    if _eligible(x, getattr(layer, "weight", None), bias) and not getattr(layer, "use_intel_amx_backend", False):
        return torch.ops.sglang_dflash.bf16_linear(x, layer.weight, bias)
    return original(self, layer, x, bias)


def compute_lm_head(original, self, hidden_states, lm_head, embedding_bias=None, *, out=None):
    """AROUND LogitsProcessor._compute_lm_head: its plain branch (an unquantized, LoRA-free head,
    no fp32 head) is `hidden @ W^T` in the weight's dtype, without the embedding bias."""
    from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

    w = getattr(lm_head, "weight", None)
    plain_head = (
        not should_apply_lm_head_quant_method(lm_head, getattr(lm_head, "quant_method", None))
        and not hasattr(lm_head, "set_lora")
        and not getattr(self, "use_fp32_lm_head", False)
        and getattr(self, "rl_on_policy_target", None) is None
        and not getattr(lm_head, "use_intel_amx_backend", False)
    )
    if plain_head and _eligible(hidden_states, w, None):
        return torch.ops.sglang_dflash.bf16_linear(hidden_states, w, None)
    return original(self, hidden_states, lm_head, embedding_bias, out=out)


def rope_forward(original, self, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
    """AROUND RotaryEmbedding.forward_native (what SGLang runs on a CPU without AMX): bf16 q/k in one
    pass (rope_qk, bit-identical to it) instead of ~25 torch ops a layer."""
    if (
        _state["on"]
        and query.dtype == torch.bfloat16
        and key is not None
        and key.dtype == torch.bfloat16
        and query.device.type == "cpu"
        and positions.numel() <= ROPE_MAX_TOKENS
        and offsets is None
        and fused_set_kv_buffer_arg is None
        and not hasattr(self, "sin_cos_cache")
        and self.cos_sin_cache.dim() == 2
        and self.cos_sin_cache.device.type == "cpu"
    ):
        return torch.ops.sglang_dflash.rope_qk(
            positions, query, key, self.cos_sin_cache, self.head_size, self.is_neox_style
        )
    return original(self, positions, query, key, offsets, fused_set_kv_buffer_arg)
