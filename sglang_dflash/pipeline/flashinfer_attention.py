"""GPU path of the non-causal block attention: one FlashInfer paged prefill over the draft KV.

Same contract as attention.TorchBlockAttention: the block's K/V rows are stored at the block's
slots, then every request's B queries attend (non-causally) to its committed context + block,
batched across requests in one kernel per drafter layer (planned once per draft forward).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from sglang_dflash import env

# Cache dtypes FlashInfer's prefill kernels take (no float32: a float32 drafter drafts with torch).
KV_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
# device -> float workspace, shared by this module's wrappers: they run one after another on one stream.
_WORKSPACE: dict = {}
# (device, window_left, backend) -> wrapper. FlashInfer fixes window_left at plan time (run asserts
# it is unchanged), so a drafter with full and sliding layers needs one planned wrapper per window.
_WRAPPERS: dict = {}


def _workspace(dev: torch.device, nbytes: int = 0) -> torch.Tensor:
    """The shared float workspace, grown to nbytes when a wrapper needs more (wrappers made before
    keep the buffer they were given)."""
    if dev not in _WORKSPACE or _WORKSPACE[dev].numel() < nbytes:
        _WORKSPACE[dev] = torch.empty(max(128 * 1024 * 1024, nbytes), dtype=torch.uint8, device=dev)
    return _WORKSPACE[dev]


def graph_tile(packed_rows: int, head_dim: int) -> int:
    """The largest query tile FlashInfer 0.7.2's FA2 prefill plan can choose on any GPU
    (FA2DetermineCtaTileQ, utils.cuh) when the longest request holds packed_rows (row, head) pairs:
    128 past 64 rows (head_dim < 256), else 64 (16 on Ampere and later up to 16 rows, or 64 when
    shared memory is short); 16 or 32 at head_dim >= 512."""
    if head_dim >= 512:
        return 16 if packed_rows <= 32 else 32
    return 128 if packed_rows > 64 and head_dim < 256 else 64


def graph_workspace_bytes(bs: int, block: int, num_heads: int, num_kv_heads: int, head_dim: int, num_sm: int) -> int:
    """FlashInfer 0.7.2's split-kv scratch for a CUDA-graph plan of bs requests of `block` queries
    (attention/scheduler.cuh, PrefillSplitQOKVIndptr and PrefillPlan), a quarter more as margin. In
    CUDA-graph mode the plan sizes for the captured rows, not the live ones: the tile is chosen as if
    one request held every row but one per other request, the padded batch is at least two CTAs per
    SM over the KV heads, and the float32 partial outputs and log-sum-exps take ceil(padded * tile /
    gqa) rows per query head (16-byte aligned each)."""
    gqa = num_heads // num_kv_heads
    rows = bs * block  # the captured plan's query rows
    tile = graph_tile((rows - bs + 1) * gqa, head_dim)
    padded = max(2 * num_sm // num_kv_heads, -(-rows * gqa // tile) + bs - 1)
    partial = -(-padded * tile // gqa)
    need = num_heads * partial * (head_dim + 1) * 4 + 2 * 16
    return need * 5 // 4


def _wrapper(dev: torch.device, left: int, backend: str, fixed: Optional[dict] = None):
    """fixed: FlashInfer's CUDA-graph buffers (one batch size for the wrapper's life); such a
    wrapper belongs to one captured batch size, so it is made anew, not shared."""
    import flashinfer

    if fixed is not None:
        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            _workspace(dev), kv_layout="NHD", backend=backend, use_cuda_graph=True, **fixed
        )
    if (dev, left, backend) not in _WRAPPERS:
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(dev), kv_layout="NHD", backend=backend)
        _WRAPPERS[dev, left, backend] = wrapper
    return _WRAPPERS[dev, left, backend]


def window_left(window: Optional[int], block: int) -> int:
    """A layer's sliding window W -> FlashInfer's window_left (-1: full attention).

    FlashInfer keeps key k for the query at position p iff k >= p - window_left (p = kv_len - qo_len
    + query row, the query's absolute position here), so W - 1 keeps the keys in (p - W, p]: the
    convention in attention.window_mask. It applies to block keys too, so the whole block stays
    visible only when W >= B; the worker runs torch attention otherwise.
    """
    if window is None:
        return -1
    if block > window:
        raise ValueError(f"FlashInfer block attention needs sliding_window={window} >= block size {block}")
    return window - 1


def paged_kv_layout(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, kv_lens: torch.Tensor):
    """kv_lens [bs] -> kv_indptr [bs+1] int32 ON THE HOST, kv_indices [sum(kv_lens)] int32 (page size
    1: slot ids, request by request). The indptr's one device->host copy is the step's only sync:
    plan() needs it on the host anyway, and its total sizes the index gather (no boolean mask)."""
    dev = req_to_token.device
    ends = torch.cumsum(kv_lens.to(torch.int64), 0)  # [bs]
    indptr = torch.cat([ends.new_zeros(1), ends]).to(torch.int32).cpu()
    t = torch.arange(int(indptr[-1]), device=dev)  # [N] flat entry index
    req = torch.searchsorted(ends, t, right=True)  # [N] owner: the first request ending after t
    col = t - (ends[req] - kv_lens.to(torch.int64)[req])  # [N] column in that request's row
    indices = req_to_token[req_pool_indices.to(torch.int64)[req], col].to(torch.int32)
    return indptr, indices


def q_dtype_for(kv_dtype: torch.dtype) -> torch.dtype:
    """Queries stay 16-bit over an fp8 cache (FlashInfer's fp8 prefill takes 16-bit q)."""
    return torch.bfloat16 if kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else kv_dtype


class FlashInferBlockAttention:
    """Planned per step (plan), run per drafter layer (__call__). With fixed_bs (a captured batch
    size), its wrappers keep their index arrays in fixed buffers (FlashInfer's CUDA-graph mode), so
    the plan runs outside a captured draft step, before each replay, and the run inside it."""

    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block: int,
        num_heads: int,
        scale: float,
        windows: Sequence[Optional[int]] = (),
        fixed_bs: Optional[int] = None,
        max_kv: int = 0,
    ):
        """k_cache, v_cache [L, S, Hkv, D]; windows[layer]: that layer's sliding window (None or
        absent: full attention); max_kv: the most keys one request can hold (fixed_bs only)."""
        dev = k_cache.device
        windows = list(windows) + [None] * (k_cache.shape[0] - len(windows))  # absent: full attention
        self.lefts = [window_left(w, block) for w in windows]  # [L]
        self.backend = env.FLASHINFER_BACKEND.get()
        self.q_dtype = q_dtype_for(k_cache.dtype)
        self.fixed_bs = fixed_bs
        wrappers = {}
        if fixed_bs is not None and dev.type == "cuda":  # the captured batch's scratch, before its wrappers
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            _workspace(dev, graph_workspace_bytes(fixed_bs, block, num_heads, k_cache.shape[2], k_cache.shape[3], sms))
        for left in sorted(set(self.lefts)):  # one wrapper per distinct window, shared by its layers
            fixed = None
            if fixed_bs is not None:
                i32 = dict(dtype=torch.int32, device=dev)
                fixed = dict(
                    qo_indptr_buf=torch.zeros(fixed_bs + 1, **i32),
                    paged_kv_indptr_buf=torch.zeros(fixed_bs + 1, **i32),
                    paged_kv_indices_buf=torch.zeros(fixed_bs * max_kv, **i32),
                    paged_kv_last_page_len_buf=torch.ones(fixed_bs, **i32),
                )
            wrappers[left] = _wrapper(dev, left, self.backend, fixed)
        self.planned = wrappers
        self.wrappers = [wrappers[left] for left in self.lefts]  # [L]
        self.k, self.v, self.block, self.num_heads, self.scale = k_cache, v_cache, block, num_heads, scale

    def plan(self, req_to_token, req_pool_indices, prefix_lens, block_slots) -> "FlashInferBlockAttention":
        """prefix_lens [bs]; block_slots [bs*B] KV slot ids of the block. Host work: the index
        arrays' one device->host copy and FlashInfer's plan."""
        bs, B = prefix_lens.numel(), self.block
        if self.fixed_bs is not None and bs != self.fixed_bs:
            raise ValueError(f"block attention fixed for batch size {self.fixed_bs} planned for {bs}")
        kv_indptr, kv_indices = paged_kv_layout(req_to_token, req_pool_indices, prefix_lens + B)
        qo_indptr = torch.arange(0, (bs + 1) * B, B, dtype=torch.int32)  # host: no sync in plan
        last_page_len = torch.ones(bs, dtype=torch.int32)
        kv = self.k.shape
        for left, wrapper in self.planned.items():
            wrapper.plan(
                qo_indptr,
                kv_indptr,
                kv_indices,
                last_page_len,
                self.num_heads,
                kv[2],
                kv[3],
                1,
                causal=False,
                sm_scale=self.scale,
                window_left=left,
                q_data_type=self.q_dtype,
                kv_data_type=self.k.dtype,
            )
        self.block_slots = block_slots
        return self

    def __call__(self, layer: int, q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor) -> torch.Tensor:
        """q [bs*B, H, D]; k_blk, v_blk [bs*B, Hkv, D] -> [bs*B, H, D]."""
        kc, vc = self.k[layer], self.v[layer]
        _store(kc, self.block_slots, k_blk)
        _store(vc, self.block_slots, v_blk)
        return self.wrappers[layer].run(q.to(self.q_dtype), (kc.unsqueeze(1), vc.unsqueeze(1))).to(q.dtype)


def _store(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """cache [S, Hkv, D] <- rows [N, Hkv, D] at slots [N]; index_copy_ has no float8 kernels, so
    one-byte caches copy their bytes."""
    rows = rows.to(cache.dtype)
    if cache.element_size() == 1:
        cache, rows = cache.view(torch.uint8), rows.view(torch.uint8)
    cache.index_copy_(0, slots, rows)
