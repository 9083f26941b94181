"""The target's Llama layer stack for decode and verify steps on CPU in one loop of our ops,
without SGLang's per-layer machinery.

On a CPU, a served width-1 step of the embedded 30-layer target spent more of its time in Python than
in arithmetic: each layer walks SGLang's layer-boundary stages (residual streams, prepare / finish
plans, capture hooks), its linear wrappers (tensor- and sequence-parallel checks), each module's
dispatch and our hooks, around four GEMMs, two norms, one rotary embedding and one attention call
(bench/step_profile.py; docs/serving.md "Cut 7"). For a single-process bf16 CPU target with plain
linear layers, where every norm, rotary embedding and GEMM of the step would take our fused op
anyway (cpu_linear.py's own tests, asked once a step), this forward calls those ops directly, in
SGLang's order, on the same tensors; the activation and attention still go through SGLang's modules.
Where a verify step's attention takes our fused chain kernel (any width) through
SGLang's torch_native backend, each layer is instead one call of csrc/cpu/llama_layer_cpu.cpp, which
runs the same ops (SGLang's KV write and the backend's attention included) from C++: the ~10
Python op calls a layer cost more than their kernels. Nothing is computed differently, so the
output is bit-identical to SGLang's forward (python_tests/test_llama_stack.py: tokens and every
logprob, stack on vs off).

Prefill (extend) batches, verify batches whose layers cannot be one call past the fused rotary
embedding's 32 rows, and anything this does not recognise (another model class, quantized or LoRA
layers, tensor/pipeline parallelism, float32, a GPU) keep SGLang's forward: srt/cpu_target.py
decides, on SGLang's own classes, and calls run().
SGLANG_DFLASH_CPU_OPS stack=: auto (on for a DFLASH server's CPU target), loop (no one-call layers), 0 (off).
"""

from __future__ import annotations

import torch

from sglang_dflash import env
from sglang_dflash.cpu import cpu_linear

_state = {"on": False, "layer_op": False}
# Target forwards of this process by path (the worker's /server_info stats): "fused" (this loop),
# "sglang" (its own forward); "layer_op": of the fused, those whose layers ran as one call each.
counts = {"fused": 0, "sglang": 0, "layer_op": 0}


def enable(device_type: str) -> bool:
    """Called by the DFLASH worker at start-up: a CPU target, not turned off."""
    stack = env.cpu_op("stack")  # read on every device: a retired CPU switch is refused at any start
    _state["on"] = device_type == "cpu" and stack != "0"
    _state["layer_op"] = stack == "auto"
    return _state["on"]


def on() -> bool:
    return _state["on"]


def one_call_layers() -> bool:
    """A verify step's layers may each be one llama_layer call (stack=auto)."""
    return _state["layer_op"]


def fast(model, positions, h) -> bool:
    """Whether every norm, rotary embedding and GEMM of this step would take our fused op at some row
    count (the hooks' own tests, on layer 0's modules, every layer being built alike; positions [1]
    and h [1, hidden] stand in for the step's, which have their dtype and device). The row bounds are
    loop_fast's: the one-call layer runs our norm and rotary ops at any row count (exact at any)."""
    layer = model.layers[0]
    attn = layer.self_attn
    return (
        cpu_linear.norm_fast(layer.input_layernorm, h)
        and cpu_linear.norm_fast(layer.input_layernorm, h, h)
        and cpu_linear.norm_fast(layer.post_attention_layernorm, h, h)
        and cpu_linear.rope_fast(attn.rotary_emb, positions, h, h)
        and all(
            cpu_linear.plain_layer(m, h, m.bias)
            for m in (attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        )
    )


def loop_fast(model, positions, h) -> bool:
    """Whether the loop's norms and rotary embeddings take our ops at this step's rows (h [T, hidden]):
    they win up to cpu_linear.NORM_MAX_TOKENS / ROPE_MAX_TOKENS, past which SGLang's forward runs
    torch's ops from Python as the loop would."""
    layer = model.layers[0]
    return cpu_linear.norm_fast(layer.input_layernorm, h, h) and cpu_linear.rope_fast(
        layer.self_attn.rotary_emb, positions, h, h
    )


# The fused layer's ops, each behind a named function so a sampling profile (bench/step_profile.py)
# can tell a GEMM from a norm: py-spy sees Python frames only.
def _gemm(module, x: torch.Tensor) -> torch.Tensor:
    return cpu_linear.linear(x, module.weight, module.bias)


def _norm(module, h: torch.Tensor, residual):
    """h, residual [T, hidden] -> (normed, residual + h); layer 0 (residual None): the embeddings
    are the residual stream."""
    if residual is None:
        return torch.ops.sglang_dflash.rms_norm(h, None, module.weight, module.variance_epsilon)[0], h
    return torch.ops.sglang_dflash.rms_norm(h, residual, module.weight, module.variance_epsilon)


def _rope(module, positions, q, k):
    return torch.ops.sglang_dflash.rope_qk(
        positions, q, k, module.cos_sin_cache, module.head_size, module.is_neox_style
    )


def _layer(layer, positions, h, residual, forward_batch, aux):
    """One decoder layer: h [T, hidden] the previous layer's output (the embeddings at layer 0),
    residual [T, hidden] or None; returns the new pair. aux collects the residual stream at this
    layer's input where the model captures it (SGLang captures the updated residual there)."""
    x, residual = _norm(layer.input_layernorm, h, residual)
    if aux is not None:
        aux.append(residual)
    attn = layer.self_attn
    q, k, v = _gemm(attn.qkv_proj, x).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q, k = _rope(attn.rotary_emb, positions, q, k)
    h = _gemm(attn.o_proj, attn.attn(q, k, v, forward_batch))
    x, residual = _norm(layer.post_attention_layernorm, h, residual)
    mlp = layer.mlp
    return _gemm(mlp.down_proj, mlp.act_fn(_gemm(mlp.gate_up_proj, x))), residual


def _layer_op(layer, positions, h, residual, forward_batch, pool, slots, prefix):
    """One decoder layer in one call: (h, residual at the layer input (aux capture), residual out)."""
    attn, mlp, rot = layer.self_attn, layer.mlp, layer.self_attn.rotary_emb
    lid = attn.attn.layer_id
    return torch.ops.sglang_dflash.llama_layer(
        h,
        residual,
        positions,
        layer.input_layernorm.weight,
        attn.qkv_proj.weight,
        attn.qkv_proj.bias,
        attn.o_proj.weight,
        layer.post_attention_layernorm.weight,
        mlp.gate_up_proj.weight,
        mlp.down_proj.weight,
        rot.cos_sin_cache,
        pool.get_key_buffer(lid),
        pool.get_value_buffer(lid),
        forward_batch.out_cache_loc,
        slots,
        prefix,
        attn.num_heads,
        attn.num_kv_heads,
        attn.head_dim,
        layer.input_layernorm.variance_epsilon,
        attn.attn.scaling,
        rot.is_neox_style,
        cpu_linear.gemm_rows(),
    )


def run(model, positions, h, forward_batch, one_call):
    """The stack from the embeddings h [T, hidden] to the final norm, each layer one call where
    one_call is (KV pool, slots, prefix), else the loop of our ops; the aux captures as SGLang's."""
    counts["fused"] += 1
    capture = set(model.layers_to_capture)
    aux = []
    residual = None
    if one_call is not None:
        counts["layer_op"] += 1
        for i, layer in enumerate(model.layers):
            h, at_input, residual = _layer_op(layer, positions, h, residual, forward_batch, *one_call)
            if i in capture:
                aux.append(at_input)
    else:
        for i, layer in enumerate(model.layers):
            h, residual = _layer(layer, positions, h, residual, forward_batch, aux if i in capture else None)
    h, _ = model.norm(h, residual)
    return (h, aux) if aux else h
