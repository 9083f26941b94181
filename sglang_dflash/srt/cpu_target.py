"""The CPU backend's hooks that need SGLang's own classes (cpu/ never imports sglang): which targets
the one-loop layer stack may run (cpu/llama_stack.py), and the LM head's plain branch on our GEMM
(cpu/cpu_linear.py). plugin.py registers both."""

from __future__ import annotations

import logging
import weakref

import torch

from sglang_dflash.cpu import cpu_linear, llama_stack, packed_weights

logger = logging.getLogger("sglang_dflash")
# Per target model, what it was found eligible for (ours, not attributes on SGLang's model).
_PLAIN_LLAMA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LAYER_OP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plain_llama(model) -> bool:
    """Every layer exactly SGLang's Llama layer with unquantized, LoRA-free linears, one process."""
    cached = _PLAIN_LLAMA.get(model)
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
    _PLAIN_LLAMA[model] = ok
    logger.info(f"target layer stack for decode/verify steps: {'one loop (llama_stack)' if ok else 'SGLang forward'}")
    return ok


def _eligible(model, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors) -> bool:
    mode = forward_batch.forward_mode
    return (
        llama_stack.on()
        and input_embeds is None
        and pp_proxy_tensors is None
        and input_ids.device.type == "cpu"
        and input_ids.numel() > 0
        and (mode.is_decode() or mode.is_target_verify())
        and _plain_llama(model)
        and llama_stack.fast(model, positions[:1], model.embed_tokens.weight[:1])
    )


def _layer_op_model(model) -> bool:
    """Whether every layer is one the one-call layer op reproduces: plain SiLU-and-mul (torch's silu
    and mul: SGLang's path on a CPU without AMX), bias-free output and MLP GEMMs, one eps for both
    norms, no KV scales (cached on the model)."""
    ok = _LAYER_OP.get(model)
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
    _LAYER_OP[model] = ok
    return ok


def _layer_op_step(model, forward_batch, h):
    """(KV pool, slots, prefix) where this step's layers can each run as one call
    (csrc/cpu/llama_layer_cpu.cpp), else None: a verify batch through SGLang's torch_native backend
    (our verify attention), rows a request few enough for the fused chain attention, a bf16 MHA pool."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    from sglang_dflash.pipeline.attention import VERIFY_MAX_ROWS, fused
    from sglang_dflash.srt.verify_backend import verify_slots

    if not llama_stack.one_call_layers() or not forward_batch.forward_mode.is_target_verify():
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


def llama_forward(original, self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None):
    """AROUND LlamaModel.forward: the stack in one loop for eligible decode / verify batches."""
    ok = _eligible(self, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors)
    h = self.embed_tokens(input_ids) if ok else None
    one_call = _layer_op_step(self, forward_batch, h) if ok else None
    # Past its ops' row bounds the loop would call torch's ops from Python, as SGLang's forward does;
    # the one-call layer runs ours at any row count (exact, and far cheaper than the Python around it).
    if not ok or (one_call is None and not llama_stack.loop_fast(self, positions, h)):
        llama_stack.counts["sglang"] += 1
        return original(self, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors)
    return llama_stack.run(self, positions, h, forward_batch, one_call)


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
    if plain_head and cpu_linear.gemm_fast(hidden_states, w, None):
        return torch.ops.sglang_dflash.bf16_linear(hidden_states, w, None)
    if plain_head and packed_weights.on() and cpu_linear.gemm_fast(hidden_states[:0], w, None):
        return packed_weights.linear(hidden_states, w, None)
    return original(self, hidden_states, lm_head, embedding_bias, out=out)
