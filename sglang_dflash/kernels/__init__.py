"""The sglang_dflash ops: the C++/CUDA extension when built, else the torch references.

`torch.ops.sglang_dflash.write_draft_kv` and `torch.ops.sglang_dflash.linear_verify_accept` exist
after `load()`; the worker calls them on every device. `bf16_linear`, `rope_qk`, `rms_norm` and `chain_attention`
are CPU ops (the target's bf16 layers, cpu/cpu_linear.py, and its verify attention, srt/verify_backend.py);
`pack_linear`, `unpack_linears` and `packed_linear` keep its weights packed for oneDNN (cpu/packed_weights.py).
"""

from __future__ import annotations

import logging

import torch

from sglang_dflash import env
from sglang_dflash.kernels import reference

logger = logging.getLogger("sglang_dflash")

# Same text as TORCH_LIBRARY in csrc/dflash_ops.cpp (a test checks they agree); used only when the
# extension is not built, to register the same ops over the torch references.
SCHEMAS = {
    "write_draft_kv": "(Tensor k, Tensor v, Tensor k_norm_weight, Tensor cos_sin_cache, Tensor positions, "
    "Tensor slots, Tensor(a!) k_cache, Tensor(b!) v_cache, float eps, bool neox, "
    "float kv_scale) -> ()",
    "linear_verify_accept": "(Tensor draft, Tensor target, Tensor prefix_lens, Tensor budget, Tensor stop_ids) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "bf16_linear": "(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
    "pack_linear": "(Tensor weight, int rows) -> bool",
    "unpack_linears": "() -> int",
    "packed_linear": "(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
    "rope_qk": "(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, int head_size, bool neox) "
    "-> (Tensor, Tensor)",
    "chain_attention": "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor slots, Tensor prefix, float scale, "
    "bool causal) -> Tensor",
    "rms_norm": "(Tensor x, Tensor? residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    "llama_layer": "(Tensor h, Tensor? residual, Tensor positions, Tensor ln1, Tensor qkv_w, Tensor? qkv_b, "
    "Tensor o_w, Tensor ln2, Tensor gate_up_w, Tensor down_w, Tensor cos_sin_cache, Tensor(a!) k_cache, "
    "Tensor(b!) v_cache, Tensor out_loc, Tensor slots, Tensor prefix, int num_heads, int num_kv_heads, "
    "int head_size, float eps, float scale, bool neox, int gemm_rows) -> (Tensor, Tensor, Tensor)",
    "cpu_isa": "() -> (int, int)",
}
# Ops with a CPU kernel only: the target's bf16 GEMMs, rotary embedding and RMSNorm on a CPU
# (cpu/cpu_linear.py) and its verify attention (srt/verify_backend.py); on GPU SGLang's own kernels
# (and FlashInfer for verify) run them.
CPU_ONLY = frozenset(
    {"bf16_linear", "pack_linear", "unpack_linears", "packed_linear", "rope_qk", "chain_attention", "rms_norm",
     "llama_layer", "cpu_isa"}
)  # fmt: skip

_state = {"loaded": False, "backend": None}


def _register_reference_ops():
    lib = torch.library.Library("sglang_dflash", "DEF")
    for name, schema in SCHEMAS.items():
        lib.define(name + schema)
    lib.impl("write_draft_kv", reference.write_draft_kv_ref, "CompositeExplicitAutograd")
    lib.impl("linear_verify_accept", reference.linear_verify_accept_ref, "CompositeExplicitAutograd")
    for name in CPU_ONLY:
        lib.impl(name, getattr(reference, name + "_ref"), "CompositeExplicitAutograd")
    _state["lib"] = lib  # keep the registration alive


def _register_fakes():
    @torch.library.register_fake("sglang_dflash::write_draft_kv")
    def _(k, v, k_norm_weight, cos_sin_cache, positions, slots, k_cache, v_cache, eps, neox, kv_scale):
        return None

    @torch.library.register_fake("sglang_dflash::linear_verify_accept")
    def _(draft, target, prefix_lens, budget, stop_ids):
        bs = draft.shape[0]
        return (
            draft.new_empty(bs),
            draft.new_empty(bs),
            draft.new_empty(bs),
            draft.new_empty(bs),
            torch.empty_like(draft),
        )

    @torch.library.register_fake("sglang_dflash::bf16_linear")
    def _(x, weight, bias):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake("sglang_dflash::packed_linear")
    def _(x, weight, bias):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake("sglang_dflash::pack_linear")
    def _(weight, rows):
        return False

    @torch.library.register_fake("sglang_dflash::rope_qk")
    def _(positions, query, key, cos_sin_cache, head_size, neox):
        return torch.empty_like(query), torch.empty_like(key)

    @torch.library.register_fake("sglang_dflash::rms_norm")
    def _(x, residual, weight, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format), (
            x.new_empty(0) if residual is None else torch.empty_like(x, memory_format=torch.contiguous_format)
        )

    @torch.library.register_fake("sglang_dflash::llama_layer")
    def _(h, residual, positions, ln1, qkv_w, qkv_b, o_w, ln2, gate_up_w, down_w, cos_sin_cache, k_cache, v_cache,
          out_loc, slots, prefix, num_heads, num_kv_heads, head_size, eps, scale, neox, gemm_rows):  # fmt: skip
        out = lambda: torch.empty_like(h, memory_format=torch.contiguous_format)  # noqa: E731
        return out(), h if residual is None else out(), out()

    @torch.library.register_fake("sglang_dflash::chain_attention")
    def _(q, k_cache, v_cache, slots, prefix, scale, causal):
        return torch.empty_like(q, memory_format=torch.contiguous_format)


def load() -> str:
    """Register the ops once; returns 'extension' or 'reference'."""
    if _state["loaded"]:
        return _state["backend"]
    try:
        if env.REFERENCE_OPS.get():
            raise ImportError(f"{env.REFERENCE_OPS.name}=1")
        import importlib.util

        spec = importlib.util.find_spec("sglang_dflash._C")
        if spec is None or not spec.origin:
            raise ImportError("sglang_dflash._C not found")
        torch.ops.load_library(spec.origin)  # registers TORCH_LIBRARY(sglang_dflash)
        backend = "extension"
    except ImportError as e:
        logger.warning("sglang_dflash C++ extension not built (%s); using the torch reference ops", e)
        _register_reference_ops()
        backend = "reference"
    _register_fakes()
    _state.update(loaded=True, backend=backend)
    return backend


def ops():
    load()
    return torch.ops.sglang_dflash


def cpu_isa() -> tuple[str, str]:
    """(the ISA level every CPU kernel dispatches on, the CPU's own), one of reference.ISA_LEVELS each:
    the extension's feature detection (csrc/cpu/cpu_features.h), capped by SGLANG_DFLASH_CPU_ISA."""
    env.CPU_ISA.get()  # an unknown value fails here, naming the choices
    level, detected = ops().cpu_isa()
    return reference.ISA_LEVELS[level], reference.ISA_LEVELS[detected]
