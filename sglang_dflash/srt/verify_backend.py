"""TARGET_VERIFY for SGLang's torch_native attention backend (CPU): B causal rows per request."""

from __future__ import annotations

import torch

from sglang_dflash.pipeline.attention import verify_attention


def torch_native_verify(backend, q, k, v, layer, forward_batch, save_kv_cache=True):
    """q [bs*B, heads*d]; k, v [bs*B, kv_heads*d]. forward_batch.seq_lens = committed prefixes."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if save_kv_cache and k is not None and v is not None:
        backend.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, backend.swa_out_cache_loc), k, v
        )
    bs = forward_batch.batch_size
    block = q.shape[0] // bs
    prefix = forward_batch.seq_lens.tolist()
    rows = backend.req_to_token_pool.req_to_token[forward_batch.req_pool_indices]
    slots = [rows[i, : p + block].to(torch.int64) for i, p in enumerate(prefix)]
    q_ = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
    out = verify_attention(
        q_,
        backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        backend.token_to_kv_pool.get_value_buffer(layer.layer_id),
        slots,
        prefix,
        block,
        layer.scaling,
    )
    return out.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)
