"""The target's bf16 GEMMs and rotary embedding on CPU, through our `bf16_linear` and `rope_qk` ops.

torch's bf16 matmul on an AVX2-only host runs at ~10 GFLOP/s a core at every shape (bench/
step_profile.py: 60-85% of a served step), while fp32 FMAs on bf16 weights widened in registers run
several times faster and read half the bytes of fp32 weights (csrc/cpu/bf16_linear_cpu.cpp); where
oneDNN's bf16 is native, its tiles win from 4 rows up but our stream still wins the decode shapes.
The DFLASH worker turns this on at start-up (`enable`) for a bf16 CPU target; SGLang's linear layers
and LM head (srt/cpu_target.py) then call the op, its rotary embeddings the fused one (one pass instead of ~25 torch
ops a layer, bit-identical: ~8% of a width-1 step, bench/step_profile.py). A plain server (no
DFLASH worker) is left as SGLang made it.
SGLANG_DFLASH_CPU_OPS linear=: auto (every GEMM where oneDNN has no native bf16; where it has, GEMMs of up
to NATIVE_BF16_MAX_ROWS rows: the decode and narrow-verify shapes, where streaming the weights once
beats oneDNN; up to DOT_BF16_MAX_ROWS where the CPU has AVX512-BF16 and the kernel its native bf16
dot products, AMX_MAX_ROWS where oneDNN also has AMX tiles), 1 (every GEMM of any bf16 CPU target),
0 (off).
"""

from __future__ import annotations

import torch

from sglang_dflash import env
from sglang_dflash.cpu import packed_weights

_state = {"on": False, "rope": False, "norm": False, "max_rows": None}
# Row bounds between our kernel and oneDNN, each where the two crossed in bench/cpu_linear_bench.py
# (the numbers: docs/decisions/2026-12-04-cpu-bf16-gemm.md, 2026-12-06-cpu-amx-gemm-routing.md,
# 2026-12-06-cpu-packed-weights.md). Our kernel streams the weights once for every row, so it wins while
# a GEMM is bound by that stream; oneDNN's tiles win once arithmetic binds.
# AVX512-BF16 host, oneDNN's own bf16 GEMM: ours (the scalar-conversion pass) up to 3 rows.
NATIVE_BF16_MAX_ROWS = 3
# ... where our kernel runs native bf16 dot products (rows_dp): ours up to 64 rows (prefill chunks
# beyond stay oneDNN's).
DOT_BF16_MAX_ROWS = 64
# With AMX, oneDNN's bf16 runs on its tiles and wins sooner: ours up to 8 rows.
AMX_MAX_ROWS = 8
# ... and with the target's weights packed once for oneDNN (packed_weights.py): ours up to 4 rows.
AMX_PACKED_MAX_ROWS = 4
# With the weights packed on an AVX512-BF16 host without AMX, oneDNN's blocked GEMM reuses each
# weight tile across more rows than our one-pass stream does: ours up to 16 rows.
DOT_PACKED_MAX_ROWS = 16
# rope_qk's scalar pass wins up to here; past it torch's vectorized ops do (bench/ops_bench.py,
# docs/decisions/2026-12-04-cpu-norm-and-rope-ops.md).
ROPE_MAX_TOKENS = 32
# rms_norm's one pass wins the decode and verify shapes (one Python call instead of ~10 torch ops);
# prefill chunks keep torch's vectorized ops.
NORM_MAX_TOKENS = 64


def wanted(device_type: str, dtype: torch.dtype) -> bool:
    """A bf16 CPU target, not turned off (auto: every GEMM or the narrow ones; enable sets which)."""
    return device_type == "cpu" and dtype == torch.bfloat16 and env.cpu_op("linear") != "0"


def native_bf16() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _isa_at_least(level: str) -> bool:
    from sglang_dflash import kernels

    return kernels.reference.ISA_LEVELS.index(kernels.cpu_isa()[0]) >= kernels.reference.ISA_LEVELS.index(level)


def dot_bf16() -> bool:
    """bf16_linear takes its AVX512-BF16 path: the extension's own dispatch level (csrc/cpu/cpu_features.h,
    SGLANG_DFLASH_CPU_ISA) says so."""
    return _isa_at_least("avx512bf16")


def amx_bf16() -> bool:
    """The CPU has AMX bf16 tiles, which oneDNN's bf16 matmul uses (and SGLANG_DFLASH_CPU_ISA allows them)."""
    return _isa_at_least("amx")


def max_rows(native: bool, dot: bool, amx: bool, packed: bool = False):
    """The most rows a GEMM takes bf16_linear on (None: every GEMM), by where each kernel wins."""
    if not native:
        return None
    if not dot:
        return NATIVE_BF16_MAX_ROWS
    if amx:
        return AMX_PACKED_MAX_ROWS if packed else AMX_MAX_ROWS
    return DOT_PACKED_MAX_ROWS if packed else DOT_BF16_MAX_ROWS


def enable(device_type: str, dtype: torch.dtype) -> bool:
    """Route this process's bf16 CPU GEMMs to bf16_linear when wanted; returns whether it is on."""
    from sglang_dflash import kernels

    _state["on"] = wanted(device_type, dtype) and kernels.load() == "extension"
    auto = env.cpu_op("linear") == "auto"
    rows = None
    if _state["on"] and auto:
        rows = max_rows(native_bf16(), dot_bf16(), amx_bf16(), packed_weights.wanted(amx_bf16()))
    _state["max_rows"] = rows
    cpu_bf16 = device_type == "cpu" and dtype == torch.bfloat16
    for key in ("rope", "norm"):
        v = env.cpu_op(key)
        _state[key] = cpu_bf16 and v != "0" and (v == "1" or _state["on"]) and kernels.load() == "extension"
    return _state["on"]


def gemm_fast(x: torch.Tensor, w, bias) -> bool:
    """Whether bf16_linear takes x [N, in] @ w [out, in]^T (+ bias)."""
    rows = _state["max_rows"]
    return (
        _state["on"]
        and (rows is None or x.numel() <= rows * x.shape[-1])
        and isinstance(w, torch.Tensor)
        and x.device.type == "cpu"
        and x.dtype == torch.bfloat16
        and w.dtype == torch.bfloat16
        and w.dim() == 2
        and (bias is None or bias.dtype == torch.bfloat16)
    )


def linear(x: torch.Tensor, w: torch.Tensor, bias=None) -> torch.Tensor:
    """x [N, in] @ w [out, in]^T (+ bias): bf16_linear where the target's GEMMs of that shape take it,
    else F.linear, exactly as linear_apply routes SGLang's layers (the drafter: DFlashDrafter.route_matmuls,
    DraftHead; the target's layer stack: llama_stack.py)."""
    if gemm_fast(x, w, bias):
        return torch.ops.sglang_dflash.bf16_linear(x, w, bias)
    return packed_weights.linear(x, w, bias)


def gemm_rows() -> int:
    """The most rows a GEMM takes bf16_linear on, as an int for the one-call layer op (llama_layer)."""
    rows = _state["max_rows"]
    return 2**62 if rows is None else rows


def plain_layer(layer, x: torch.Tensor, bias) -> bool:
    """Whether this linear layer's UnquantizedLinearMethod.apply is linear() for x's dtype and device
    at any row count: bf16_linear (layer_fast) or, past its rows, F.linear."""
    return layer_fast(layer, x[:0], bias)


def layer_fast(layer, x: torch.Tensor, bias) -> bool:
    """Whether bf16_linear stands in for this linear layer's UnquantizedLinearMethod.apply."""
    return gemm_fast(x, getattr(layer, "weight", None), bias) and not getattr(layer, "use_intel_amx_backend", False)


def linear_apply(original, self, layer, x, bias=None):
    """AROUND UnquantizedLinearMethod.apply (its last branch is F.linear on CPU)."""
    if layer_fast(layer, x, bias):
        return torch.ops.sglang_dflash.bf16_linear(x, layer.weight, bias)
    if packed_weights.on() and plain_layer(layer, x, bias):  # past bf16_linear's rows: F.linear's branch
        return packed_weights.linear(x, layer.weight, bias)
    return original(self, layer, x, bias)


def rope_fast(self, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None) -> bool:
    """Whether rope_qk stands in for this RotaryEmbedding.forward_native call."""
    return (
        _state["rope"]
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
    )


def rope_forward(original, self, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
    """AROUND RotaryEmbedding.forward_native (what SGLang runs on a CPU without AMX): bf16 q/k in one
    pass (rope_qk, bit-identical to it) instead of ~25 torch ops a layer."""
    if rope_fast(self, positions, query, key, offsets, fused_set_kv_buffer_arg):
        return torch.ops.sglang_dflash.rope_qk(
            positions, query, key, self.cos_sin_cache, self.head_size, self.is_neox_style
        )
    return original(self, positions, query, key, offsets, fused_set_kv_buffer_arg)


def norm_fast(self, x, residual=None, post_residual_addition=None, quant_linear=None) -> bool:
    """Whether rms_norm stands in for this RMSNorm.forward_native call."""
    return (
        _state["norm"]
        and x.dtype == torch.bfloat16
        and x.device.type == "cpu"
        and x.dim() >= 1
        and x.numel() <= NORM_MAX_TOKENS * x.shape[-1]
        and x.shape[-1] == self.hidden_size
        and self.weight.dtype in (torch.bfloat16, torch.float32)
        and (residual is None or (residual.dtype == torch.bfloat16 and residual.shape == x.shape))
        and post_residual_addition is None
        and quant_linear is None
        and not getattr(self, "fp32_residual", False)
        and getattr(self, "variance_size_override", None) is None
        and getattr(self, "override_orig_dtype", None) in (None, torch.bfloat16)
        and not getattr(self, "cast_x_before_out_mul", False)
    )


def rms_norm_forward(original, self, x, residual=None, post_residual_addition=None, quant_linear=None):
    """AROUND RMSNorm.forward_native (what SGLang runs on a CPU without AMX): bf16 decode and verify
    rows in one call (rms_norm, bit-identical to it) instead of ~10 torch ops."""
    if norm_fast(self, x, residual, post_residual_addition, quant_linear):
        out, res = torch.ops.sglang_dflash.rms_norm(x, residual, self.weight, self.variance_epsilon)
        return out if residual is None else (out, res)
    return original(self, x, residual, post_residual_addition, quant_linear)
