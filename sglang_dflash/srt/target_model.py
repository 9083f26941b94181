"""What the worker needs from SGLang's target model: aux feature capture and the drafter's view of
the KV pool (attention over the drafter KV, debug dumps)."""

from __future__ import annotations

import os

import torch

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


def block_attention(cfg: DrafterConfig, block: int, cuda: bool, kv: DraftKVCache, req_to_token, batch, prefix, slots):
    """Non-causal block attention for one step: FlashInfer on CUDA unless a window < B (see
    window_left), else torch. prefix [bs]; slots [bs*B] KV slot ids of the block."""
    scale = cfg.head_dim**-0.5
    windows = cfg.layer_windows
    if cuda and all(w is None or w >= block for w in windows):
        from sglang_dflash.pipeline.flashinfer_attention import FlashInferBlockAttention

        args = (req_to_token, batch.req_pool_indices, prefix, slots, block, cfg.num_heads, scale, windows)
        return FlashInferBlockAttention(kv.k, kv.v, *args)
    # The one host sync of the torch path (free on CPU; on CUDA it runs only when a window < B).
    table = slot_table(req_to_token, batch.req_pool_indices, int(prefix.max()) + block)  # [bs, max prefix + B]
    return TorchBlockAttention(kv.k, kv.v, table, slots, scale, windows, prefix=prefix)


def dump_context(kv: DraftKVCache, req_to_token, batch, out_dir: str) -> None:
    """Debug: save every request's drafter context K/V rows (tests compare cached and cold prefills)."""
    for req, rpi, n in zip(batch.reqs, batch.req_pool_indices.tolist(), batch.seq_lens.tolist()):
        slots = req_to_token[rpi, :n].to(torch.int64)
        rows = {"ids": list(req.origin_input_ids), "k": kv.k[:, slots].clone(), "v": kv.v[:, slots].clone()}
        torch.save(rows, os.path.join(out_dir, f"{req.rid}.pt"))
