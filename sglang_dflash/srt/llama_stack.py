"""The target's Llama layer stack for decode and verify steps on CPU in one loop of our ops,
without SGLang's per-layer machinery.

On a CPU, a served width-1 step of the embedded 30-layer target spent more of its time in Python than
in arithmetic: each layer walks SGLang's layer-boundary stages (residual streams, prepare / finish
plans, capture hooks), its linear wrappers (tensor- and sequence-parallel checks), each module's
dispatch and our hooks, around four GEMMs, two norms, one rotary embedding and one attention call
(bench/step_profile.py; docs/serving.md "Cut 7"). For a single-process bf16 CPU target with plain
linear layers, where every norm, rotary embedding and GEMM of the step would take our fused op
anyway (srt/cpu_linear.py's own tests, asked once a step), this forward calls those ops directly, in
SGLang's order, on the same tensors; the activation and attention still go through SGLang's modules.
Where a verify step's attention takes our fused chain kernel (any width) through
SGLang's torch_native backend, each layer is instead one call of csrc/llama_layer_cpu.cpp, which
runs the same ops (SGLang's KV write and the backend's attention included) from C++: the ~10
Python op calls a layer cost more than their kernels. Nothing is computed differently, so the
output is bit-identical to SGLang's forward (python_tests/test_llama_stack.py: tokens and every
logprob, stack on vs off).

Prefill (extend) batches, verify batches whose layers cannot be one call past the fused rotary
embedding's 32 rows, and anything this does not recognise (another model class, quantized or LoRA
layers, tensor/pipeline parallelism, float32, a GPU) keep SGLang's forward.
SGLANG_DFLASH_CPU_OPS stack=: auto (on for a DFLASH server's CPU target), loop (no one-call layers), 0 (off).
"""

from __future__ import annotations

import logging

import torch

from sglang_dflash import env
from sglang_dflash.srt import cpu_linear

logger = logging.getLogger("sglang_dflash")

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


def _plain_llama(model) -> bool:
    """Every layer exactly SGLang's Llama layer with unquantized, LoRA-free linears, one process."""
    cached = getattr(model, "_dflash_plain_llama", None)
    if cached is not None:
        return cached
    from sglang.srt.distributed.utils import get_group_rank_size
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
    from sglang.srt.models.llama import LlamaDecoderLayer
    from sglang.srt.runtime_context import get_parallel

    def plain_linear(m) -> bool:  # a LoRA wrapper has a base_layer (and may lack quant_method)
        return (
            type(getattr(m, "quant_method", None)) is UnquantizedLinearMethod
            and not hasattr(m, "base_layer")
            and not getattr(m, "use_intel_amx_backend", False)
            and not getattr(m, "skip_bias_add", False)
            and get_group_rank_size(m.tp_group)[1] == 1
        )

    layers = list(model.layers)
    ok = (
        get_parallel().tp_size == 1  # a layer's sums across ranks live in the boundaries this skips
        and model.pp_group.world_size == 1
        and model.start_layer == 0
        and model.end_layer == len(layers)
        and all(type(layer) is LlamaDecoderLayer for layer in layers)
        and all(
            plain_linear(m)
            for layer in layers
            for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        )
        and all(layer.mlp.dual_gemm.mode is None and not layer.mlp.activation_quant.enabled for layer in layers)
    )
    model._dflash_plain_llama = ok
    logger.info(f"target layer stack for decode/verify steps: {'one loop (llama_stack)' if ok else 'SGLang forward'}")
    return ok


def _eligible(model, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors) -> bool:
    mode = forward_batch.forward_mode
    return (
        _state["on"]
        and input_embeds is None
        and pp_proxy_tensors is None
        and input_ids.device.type == "cpu"
        and input_ids.numel() > 0
        and (mode.is_decode() or mode.is_target_verify())
        and _plain_llama(model)
        and _fast(model, positions[:1], model.embed_tokens.weight[:1])
    )


def _fast(model, positions, h) -> bool:
    """Whether every norm, rotary embedding and GEMM of this step would take our fused op at some row
    count (the hooks' own tests, on layer 0's modules, every layer being built alike; positions [1]
    and h [1, hidden] stand in for the step's, which have their dtype and device). The row bounds are
    _loop_fast's: the one-call layer runs our norm and rotary ops at any row count (exact at any)."""
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


def _loop_fast(model, positions, h) -> bool:
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


def _layer_op_model(model) -> bool:
    """Whether every layer is one the one-call layer op reproduces: plain SiLU-and-mul (torch's silu
    and mul: SGLang's path on a CPU without AMX), bias-free output and MLP GEMMs, one eps for both
    norms, no KV scales (cached on the model)."""
    ok = getattr(model, "_dflash_layer_op", None)
    if ok is not None:
        return ok
    from sglang.srt.layers import activation

    ok = not activation._is_cpu_amx_available and all(
        type(layer.mlp.act_fn) is activation.SiluAndMul
        and layer.self_attn.o_proj.bias is None
        and layer.mlp.gate_up_proj.bias is None
        and layer.mlp.down_proj.bias is None
        and layer.input_layernorm.variance_epsilon == layer.post_attention_layernorm.variance_epsilon
        and getattr(layer.self_attn.attn, "k_scale", None) is None
        and getattr(layer.self_attn.attn, "v_scale", None) is None
        for layer in model.layers
    )
    model._dflash_layer_op = ok
    return ok


def _layer_op_step(model, forward_batch, h):
    """(KV pool, slots, prefix) where this step's layers can each run as one call
    (csrc/llama_layer_cpu.cpp), else None: a verify batch through SGLang's torch_native backend (our
    verify attention), rows a request few enough for the fused chain attention, a bf16 MHA pool."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    from sglang_dflash.pipeline.attention import VERIFY_MAX_ROWS, fused
    from sglang_dflash.srt.verify_backend import verify_slots

    if not _state["layer_op"] or not forward_batch.forward_mode.is_target_verify():
        return None
    if not _layer_op_model(model):
        return None
    backend = get_attn_backend()
    pool = backend.token_to_kv_pool  # where torch_native_verify writes and reads
    if type(backend).__name__ != "TorchNativeAttnBackend" or type(pool).__name__ != "MHATokenToKVPool":
        return None
    attn = model.layers[0].self_attn
    rows = h.shape[0] // forward_batch.batch_size
    k0, v0 = pool.get_key_buffer(attn.attn.layer_id), pool.get_value_buffer(attn.attn.layer_id)
    if k0.dtype != torch.bfloat16 or not fused(
        h.new_empty(0, attn.num_heads, attn.head_dim), k0, v0, rows, VERIFY_MAX_ROWS
    ):
        return None
    return (pool, *verify_slots(backend, forward_batch, rows))


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


def forward(original, self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None):
    """AROUND LlamaModel.forward: the stack in one loop for eligible decode / verify batches."""
    ok = _eligible(self, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors)
    h = self.embed_tokens(input_ids) if ok else None
    one_call = _layer_op_step(self, forward_batch, h) if ok else None
    # Past its ops' row bounds the loop would call torch's ops from Python, as SGLang's forward does;
    # the one-call layer runs ours at any row count (exact, and far cheaper than the Python around it).
    if not ok or (one_call is None and not _loop_fast(self, positions, h)):
        counts["sglang"] += 1
        return original(self, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors)
    counts["fused"] += 1
    capture = set(self.layers_to_capture)
    aux = []
    residual = None
    if one_call is not None:
        counts["layer_op"] += 1
        for i, layer in enumerate(self.layers):
            h, at_input, residual = _layer_op(layer, positions, h, residual, forward_batch, *one_call)
            if i in capture:
                aux.append(at_input)
    else:
        for i, layer in enumerate(self.layers):
            h, residual = _layer(layer, positions, h, residual, forward_batch, aux if i in capture else None)
    h, _ = self.norm(h, residual)
    return (h, aux) if aux else h
