"""GPU path of the non-causal block attention: one FlashInfer paged prefill over the draft KV.

Same contract as attention.TorchBlockAttention: the block's K/V rows are stored at the block's
slots, then every request's B queries attend (non-causally) to its committed context + block,
batched across requests in one kernel per drafter layer (planned once per draft forward).
"""
from __future__ import annotations

import torch

_WORKSPACE: dict = {}


def paged_kv_layout(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, kv_lens: torch.Tensor):
    """-> kv_indptr [bs+1] int32, kv_indices [sum(kv_lens)] int32 (page size 1: slot ids)."""
    rows = req_to_token[req_pool_indices.to(torch.int64)]
    cols = torch.arange(rows.shape[1], device=rows.device)[None, :]
    indices = rows[cols < kv_lens[:, None]].to(torch.int32)  # row-major: request by request
    indptr = torch.zeros(kv_lens.numel() + 1, dtype=torch.int32, device=rows.device)
    indptr[1:] = torch.cumsum(kv_lens, 0)
    return indptr, indices


class FlashInferBlockAttention:
    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                 req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, block_slots: torch.Tensor,
                 block: int, num_heads: int, scale: float):
        """k_cache, v_cache [L, S, Hkv, D]; prefix_lens [bs]; block_slots [bs*B]."""
        import flashinfer

        dev = k_cache.device
        if dev not in _WORKSPACE:
            buf = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
            _WORKSPACE[dev] = flashinfer.BatchPrefillWithPagedKVCacheWrapper(buf, kv_layout="NHD")
        self.wrapper = _WORKSPACE[dev]
        bs = prefix_lens.numel()
        kv_indptr, kv_indices = paged_kv_layout(req_to_token, req_pool_indices, prefix_lens + block)
        qo_indptr = torch.arange(0, (bs + 1) * block, block, dtype=torch.int32, device=dev)
        last_page_len = torch.ones(bs, dtype=torch.int32, device=dev)
        self.wrapper.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, num_heads, k_cache.shape[2],
                          k_cache.shape[3], 1, causal=False, sm_scale=scale, q_data_type=k_cache.dtype,
                          kv_data_type=k_cache.dtype)
        self.k, self.v, self.block_slots = k_cache, v_cache, block_slots

    def __call__(self, layer: int, q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor) -> torch.Tensor:
        """q [bs*B, H, D]; k_blk, v_blk [bs*B, Hkv, D] -> [bs*B, H, D]."""
        kc, vc = self.k[layer], self.v[layer]
        kc.index_copy_(0, self.block_slots, k_blk.to(kc.dtype))
        vc.index_copy_(0, self.block_slots, v_blk.to(vc.dtype))
        return self.wrapper.run(q.to(kc.dtype), (kc.unsqueeze(1), vc.unsqueeze(1))).to(q.dtype)
