"""The target's TARGET_VERIFY forward over W chain rows per request: the forward itself (for a
scheduler batch, and for the start-up profile's dummy batch), and the torch_native attention
backend's verify path (CPU): W causal rows per request."""

from __future__ import annotations

import contextlib

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.speculative.dflash_info import DFlashVerifyInput

import torch

from sglang_dflash.pipeline.attention import VERIFY_MAX_ROWS, RowPlan, attend_plan, fused, slot_table, verify_plan


def verify_forward(target_worker, batch, draft, positions, slots, widths=None):
    """draft, positions, slots [bs, W] -> (the target's logits output over the chain, features kept;
    whether it replayed a captured graph). widths: verify_widths.VerifyWidths (CUDA) or None."""
    width = draft.shape[1]
    batch.out_cache_loc = slots.reshape(-1)
    # The attention plan's host bound = committed prefix + the W chain rows (FlashInfer's graph
    # replay requires it); the scheduler's own value is restored right after the forward batch
    # copied it. The plan itself runs once, in the forward (deferred), graph or eager.
    saved = (batch.seq_lens_cpu, batch.seq_lens_sum)
    if batch.seq_lens_cpu is not None:
        batch.seq_lens_cpu = batch.seq_lens_cpu + width
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    with _at(widths, width):
        fb, _ = _verify_input(draft, positions).prepare_for_verify(batch, target_worker, defer_metadata_init=True)
        batch.seq_lens_cpu, batch.seq_lens_sum = saved
        out = target_worker.forward_batch_generation(batch=None, forward_batch=fb, is_verify=True)
    return out.logits_output, bool(out.can_run_cuda_graph)


def dummy_verify_forward(target_worker, draft, positions, slots, pool_rows, prefix, widths=None):
    """The same forward for a batch built without the scheduler (start-up profile): pool_rows [bs]
    request-pool rows, prefix [bs] their committed lengths."""
    runner = target_worker.model_runner
    bs, width = draft.shape
    host = prefix.cpu() + width  # the plan's bound, as verify_forward sets it
    fb = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=bs,
        input_ids=draft.reshape(-1),
        req_pool_indices=pool_rows,
        seq_lens=prefix,
        seq_lens_cpu=host,
        out_cache_loc=slots.reshape(-1),
        seq_lens_sum=int(host.sum()),
        return_logprob=False,
        positions=positions.reshape(-1),
        spec_algorithm=runner.spec_algorithm,
        spec_info=_verify_input(draft, positions),
        capture_hidden_mode=CaptureHiddenMode.FULL,
        global_forward_mode=ForwardMode.TARGET_VERIFY,
    )
    runner.kv_index_translator.bind_runner_slots(fb)
    with _at(widths, width):
        return target_worker.forward_batch_generation(batch=None, forward_batch=fb, is_verify=True).logits_output


def _at(widths, width: int):
    return widths.at(width) if widths is not None else contextlib.nullcontext()


def _verify_input(draft, positions) -> DFlashVerifyInput:
    return DFlashVerifyInput(
        draft_token=draft.reshape(-1),
        positions=positions.reshape(-1),
        draft_token_num=draft.shape[1],
        custom_mask=None,
        capture_hidden_mode=CaptureHiddenMode.FULL,
    )


def torch_native_verify(backend, q, k, v, layer, forward_batch, save_kv_cache=True):
    """q [bs*B, heads*d]; k, v [bs*B, kv_heads*d]. forward_batch.seq_lens = committed prefixes."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if save_kv_cache and k is not None and v is not None:
        backend.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, backend.swa_out_cache_loc), k, v
        )
    q_ = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
    k_cache = backend.token_to_kv_pool.get_key_buffer(layer.layer_id)
    v_cache = backend.token_to_kv_pool.get_value_buffer(layer.layer_id)
    block = q.shape[0] // forward_batch.batch_size
    if fused(q_, k_cache, v_cache, block, VERIFY_MAX_ROWS):
        slots, prefix = verify_slots(backend, forward_batch, block)
        out = torch.ops.sglang_dflash.chain_attention(q_, k_cache, v_cache, slots, prefix, layer.scaling, True)
    else:
        out = attend_plan(_verify_plan(backend, forward_batch, block), q_, k_cache, v_cache, layer.scaling)
    return out.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)


class _ThisForward:
    """What every layer of one verify forward shares, kept here (not on SGLang's ForwardBatch, a
    dataclass without a hash): one forward at a time per scheduler, so one entry, valid while it is
    the same forward batch object (held until the next forward replaces it, so its id is not reused)."""

    def __init__(self):
        self.batch = None
        self.block, self.slots, self.prefix, self.plan = 0, None, None, None

    def of(self, forward_batch, block: int) -> bool:
        if self.batch is forward_batch and self.block == block:
            return True
        self.batch, self.block, self.slots, self.prefix, self.plan = forward_batch, block, None, None, None
        return False


_this = _ThisForward()


def verify_slots(backend, forward_batch, block: int):
    """(slots [bs, bound + B] int64, prefix [bs] int64): the rows every layer of this verify forward
    reads, the same for all of them, so built at the first layer and kept for the forward's other
    layers. chain_attention reads them as they are; the gather + SDPA path plans on them."""
    if _this.of(forward_batch, block) and _this.slots is not None:
        return _this.slots, _this.prefix
    prefix = forward_batch.seq_lens  # [bs]
    host = forward_batch.seq_lens_cpu
    if prefix.is_cpu or host is None:
        width = int(prefix.max()) + block  # free on CPU; elsewhere one device sync per forward
    else:
        # No device sync. SGLang's seq_lens_cpu is the prefix, but verify_forward bumps it to
        # prefix + B for the attention plan: + B bounds it either way (extra columns are masked).
        width = int(host.max()) + block
    _this.slots = slot_table(backend.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, width)
    _this.prefix = prefix.to(torch.int64)
    return _this.slots, _this.prefix


def _verify_plan(backend, forward_batch, block: int) -> RowPlan:
    """The gather + SDPA plan over verify_slots' rows, once per forward."""
    if _this.of(forward_batch, block) and _this.plan is not None:
        return _this.plan
    _this.plan = verify_plan(*verify_slots(backend, forward_batch, block), block)
    return _this.plan
