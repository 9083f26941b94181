"""What the worker needs from SGLang's target model: aux feature capture and the drafter's view of
the KV pool (attention over the drafter KV, debug dumps)."""

from __future__ import annotations

import os

import torch

from sglang_dflash import env

from sglang_dflash.model.config import DrafterConfig
from sglang_dflash.pipeline.attention import TorchBlockAttention, slot_table
from sglang_dflash.pipeline.context_kv import DraftKVCache


def check_capture_layers(model, cfg: DrafterConfig) -> None:
    """Make the target capture the drafter's feature layers, or fail at start-up naming both lists."""
    want = [i + 1 for i in cfg.target_layer_ids]  # SGLang captures the input of layer id+1
    have = list(getattr(getattr(model, "model", None), "layers_to_capture", []) or [])
    if not have and hasattr(model, "set_dflash_layers_to_capture"):
        model.set_dflash_layers_to_capture(cfg.target_layer_ids)
    elif have != want:
        raise ValueError(
            f"target captures layers {have} but the drafter needs {want} (target_layer_ids={cfg.target_layer_ids})"
        )
    if not getattr(model, "capture_aux_hidden_states", False):
        raise ValueError(f"target architecture {type(model).__name__} cannot capture DFlash features")


def block_attention(
    cfg: DrafterConfig,
    block: int,
    cuda: bool,
    kv: DraftKVCache,
    req_to_token,
    req_pool_indices,
    prefix,
    slots,
    reuse=None,
    fixed: bool = False,
):
    """Non-causal block attention for one step: FlashInfer on CUDA unless a window < B (see
    window_left), else torch. prefix [bs]; slots [bs*B] KV slot ids of the block. fixed: for a
    captured batch size (FlashInfer's fixed buffers); reuse: that batch size's attention, re-planned."""
    scale = cfg.head_dim**-0.5
    windows = cfg.layer_windows
    if uses_flashinfer(cfg, block, cuda, kv.k.dtype):
        from sglang_dflash.pipeline.flashinfer_attention import FlashInferBlockAttention

        if reuse is None:
            bs = len(prefix) if fixed else None
            width = int(req_to_token.shape[1]) + block
            reuse = FlashInferBlockAttention(kv.k, kv.v, block, cfg.num_heads, scale, windows, bs, width)
        return reuse.plan(req_to_token, req_pool_indices, prefix, slots)
    # The one host sync of the torch path (free on CPU; on CUDA only for float32 or a window < B).
    table = slot_table(req_to_token, req_pool_indices, int(prefix.max()) + block)  # [bs, max prefix + B]
    fresh = TorchBlockAttention(kv.k, kv.v, table, slots, scale, windows, prefix=prefix)
    if reuse is None:
        return fresh
    reuse.__dict__.update(fresh.__dict__)  # re-planned in place: a replayed step holds this object
    return reuse


def capturable(cfg: DrafterConfig, block: int, cuda: bool, dtype: torch.dtype) -> bool:
    """Whether a CUDA graph can hold the draft step: FlashInfer's is planned outside it; the torch
    path's key table changes shape with the longest context, so it runs eagerly."""
    return uses_flashinfer(cfg, block, cuda, dtype)


def uses_flashinfer(cfg: DrafterConfig, block: int, cuda: bool, dtype: torch.dtype) -> bool:
    """FlashInfer drafts on CUDA unless a layer's window hides block rows (W < B) or the cache is
    float32 (FlashInfer has no float32 kernels); torch attention serves those."""
    from sglang_dflash.pipeline.flashinfer_attention import KV_DTYPES

    return cuda and dtype in KV_DTYPES and all(w is None or w >= block for w in cfg.layer_windows)


@torch.inference_mode()
def warm_up_block_attention(cfg: DrafterConfig, block: int, cuda: bool, kv: DraftKVCache, attention=block_attention):
    """Start-up: plan and run the drafter's block attention once per layer on a dummy one-request
    batch with the drafter's head layout, through the decode step's own `attention` choice. A
    FlashInfer JIT, plan or run failure then stops start-up naming FlashInfer, instead of failing
    every draft step into the exact-but-undrafted fallback (which no output check can see)."""
    dev = kv.k.device
    flashinfer = uses_flashinfer(cfg, block, cuda, kv.k.dtype)
    # Slot 0 is SGLang's padding slot: the dummy request's context and block both live there.
    req_to_token = torch.zeros(1, 1 + block, dtype=torch.int32, device=dev)  # [1, prefix + B]
    prefix = torch.ones(1, dtype=torch.int64, device=dev)  # [1]
    req_pool_indices = torch.zeros(1, dtype=torch.int64, device=dev)  # [1]
    slots = torch.zeros(block, dtype=torch.int64, device=dev)  # [B]
    dtype = kv.k.dtype if kv.k.element_size() > 1 else torch.bfloat16
    q = torch.randn(block, cfg.num_heads, cfg.head_dim, device=dev).to(dtype)  # [B, H, D]
    kb = torch.randn(block, cfg.num_kv_heads, cfg.head_dim, device=dev).to(dtype)  # [B, Hkv, D]
    try:
        if env.DEBUG_FAIL_WARMUP.get():
            raise RuntimeError(f"injected warm-up failure ({env.DEBUG_FAIL_WARMUP.name})")
        attend = attention(cfg, block, cuda, kv, req_to_token, req_pool_indices, prefix, slots)
        outs = [attend(layer, q, kb, kb) for layer in range(cfg.num_layers)]
        bad = [i for i, o in enumerate(outs) if o.shape != q.shape or not bool(o.isfinite().all())]
        if bad:
            raise RuntimeError(f"layers {bad} returned a wrong shape or non-finite values")
    except Exception as e:
        raise RuntimeError(warm_up_error(cfg, block, kv.k.dtype, flashinfer, e)) from e


def warm_up_error(cfg: DrafterConfig, block: int, dtype: torch.dtype, flashinfer: bool, e: Exception) -> str:
    layout = (
        f"{cfg.num_heads} query / {cfg.num_kv_heads} KV heads, head_dim {cfg.head_dim}, {dtype} cache, block {block}"
    )
    if not flashinfer:
        return f"DFLASH drafter block attention (torch) failed its start-up warm-up ({layout}): {type(e).__name__}: {e}"
    backend = env.FLASHINFER_BACKEND
    return (
        f"FlashInfer block attention failed its start-up warm-up ({layout}, backend {backend.get()}): "
        f"{type(e).__name__}: {e}. Fix: install a FlashInfer that matches this torch and CUDA "
        f"(flashinfer-python; without prebuilt kernels it JIT-compiles them with nvcc at this point), "
        f"or set {backend.name} to another of {', '.join(backend.choices)}."
    )


def dump_context(kv: DraftKVCache, req_to_token, batch, out_dir: str) -> None:
    """Debug: save every request's drafter context K/V rows (tests compare cached and cold prefills)."""
    for req, rpi, n in zip(batch.reqs, batch.req_pool_indices.tolist(), batch.seq_lens.tolist()):
        slots = req_to_token[rpi, :n].to(torch.int64)
        rows = {"ids": list(req.origin_input_ids), "k": kv.k[:, slots].clone(), "v": kv.v[:, slots].clone()}
        torch.save(rows, os.path.join(out_dir, f"{req.rid}.pt"))
