"""A CPU stand-in for FlashInfer's paged prefill wrapper, so the FlashInfer block-attention path
(layout, planning, per-window wrappers, start-up warm-up) runs in tests without a GPU."""

import torch


class FakePrefillWrapper:
    """CPU stand-in for flashinfer.BatchPrefillWithPagedKVCacheWrapper (NHD, page size 1): plain
    math with FlashInfer's own mask rule for window_left, as its kernel states it
    (attention/variants.cuh): keep kv_idx iff kv_idx + qo_len + window_left >= kv_len + qo_idx.
    fixed: FlashInfer's CUDA-graph buffers (use_cuda_graph=True): plan copies the index arrays into
    them and run reads them there, as a captured run would; one batch size for the wrapper's life."""

    def __init__(self, fixed=None):
        self.fixed = fixed

    def plan(
        self,
        qo_indptr,
        kv_indptr,
        kv_indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        *,
        causal,
        sm_scale,
        window_left=-1,
        q_data_type=None,
        kv_data_type=None,
    ):
        assert page_size == 1 and not causal and bool((last_page_len == 1).all())
        # FlashInfer copies the indptrs to the host in plan(); given on the host, that costs no sync.
        assert qo_indptr.device.type == "cpu" and kv_indptr.device.type == "cpu", "indptrs must be host tensors"
        self.q_dtype, self.kv_dtype = q_data_type, kv_data_type
        self.qo, self.kv, self.idx = qo_indptr.tolist(), kv_indptr.tolist(), kv_indices.long()
        self.scale, self.left = sm_scale, window_left
        if self.fixed is not None:
            f = self.fixed
            if len(qo_indptr) != len(f["qo_indptr_buf"]):
                raise ValueError(f"batch size {len(qo_indptr) - 1} != fixed {len(f['qo_indptr_buf']) - 1}")
            f["qo_indptr_buf"].copy_(qo_indptr)
            f["paged_kv_indptr_buf"].copy_(kv_indptr)
            f["paged_kv_indices_buf"][: kv_indices.numel()].copy_(kv_indices)
            f["paged_kv_last_page_len_buf"].copy_(last_page_len)
            self.qo, self.kv, self.idx = None, None, None  # run must read the buffers

    def _layout(self):
        if self.fixed is None:
            return self.qo, self.kv, self.idx
        f = self.fixed
        return f["qo_indptr_buf"].tolist(), f["paged_kv_indptr_buf"].tolist(), f["paged_kv_indices_buf"].long()

    def run(self, q, paged):  # q [N, H, D]; paged: k, v [S, 1, Hkv, D]
        assert q.dtype == self.q_dtype and paged[0].dtype == self.kv_dtype, "run() dtypes differ from plan()"
        k_all, v_all = paged[0][:, 0].to(q.dtype), paged[1][:, 0].to(q.dtype)
        out = torch.empty_like(q)
        qo, kv, idx = self._layout()
        for b in range(len(qo) - 1):
            qb = q[qo[b] : qo[b + 1]]
            slots = idx[kv[b] : kv[b + 1]]
            rep = q.shape[1] // k_all.shape[1]
            k, v = k_all[slots].repeat_interleave(rep, 1), v_all[slots].repeat_interleave(rep, 1)
            qo_len, kv_len = qb.shape[0], k.shape[0]
            logits = torch.einsum("qhd,khd->hqk", qb, k) * self.scale
            if self.left >= 0:
                qi, ki = torch.arange(qo_len)[:, None], torch.arange(kv_len)[None, :]
                logits = logits.masked_fill(~(ki + qo_len + self.left >= kv_len + qi), float("-inf"))
            out[qo[b] : qo[b + 1]] = torch.einsum("hqk,khd->qhd", logits.softmax(-1), v)
        return out
