"""Verify attention (pipeline/attention.py, srt/verify_backend.py): causal within the block, and its
plan (slot table, length groups, mask; or the fused op's slot table) built once per verify forward
and shared by its layers, each layer still attending over its own cache."""

import sys
from types import SimpleNamespace

import pytest
import torch

from sglang_dflash.pipeline import attention
from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

install_cpu_shims()  # before the srt import below pulls in sgl_kernel (SGLang's CPU engine: make's environment)
from sglang_dflash.srt import verify_backend  # noqa: E402
from sglang_dflash.srt.verify_backend import torch_native_verify  # noqa: E402
from test_stages import RAGGED, looped, paged_pool  # noqa: E402


@pytest.mark.parametrize("fused", ["1", "0"])
def test_verify_plan_is_built_once_per_forward(monkeypatch, fused):
    """Every layer of one verify forward reads the same rows: the plan (slot table, length groups,
    mask; fused: the op's slot table) is built at the first layer and reused; each layer still
    attends over its own cache."""
    monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", f"attention={fused}")
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.memory_pool", SimpleNamespace(KVWriteLoc=None))
    B = attention.FUSED_MAX_ROWS
    (k, v, r2t, rpi, kv_slots), q = paged_pool(RAGGED, B, layers=2), torch.randn(len(RAGGED) * B, 9, 64)
    kv = SimpleNamespace(get_key_buffer=lambda i: k[i], get_value_buffer=lambda i: v[i])
    backend = SimpleNamespace(token_to_kv_pool=kv, req_to_token_pool=SimpleNamespace(req_to_token=r2t))
    fb = SimpleNamespace(batch_size=len(RAGGED), seq_lens=torch.tensor(RAGGED), seq_lens_cpu=None, req_pool_indices=rpi)
    built = []
    owner, name = (verify_backend, "slot_table") if fused == "1" else (attention, "plan_rows")
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **kw: built.append(1) or real(*a, **kw))
    for i in range(2):
        layer = SimpleNamespace(tp_q_head_num=9, qk_head_dim=64, v_head_dim=64, layer_id=i, scaling=0.125)
        got = torch_native_verify(backend, q.reshape(q.shape[0], -1), None, None, layer, fb, save_kv_cache=False)
        torch.testing.assert_close(got.view_as(q), looped(q, k[i], v[i], kv_slots, B, causal=True), rtol=0, atol=1e-5)
    assert len(built) == 1
    fb2 = SimpleNamespace(**{k_: v_ for k_, v_ in vars(fb).items() if not k_.startswith("_")})
    torch_native_verify(backend, q.reshape(q.shape[0], -1), None, None, layer, fb2, save_kv_cache=False)
    assert len(built) == 2, "a new forward batch (the next step) plans anew"


def test_batched_verify_is_causal():
    """Changing block row 2's K/V moves rows 2.. of that request only: a non-causal mask fails this."""
    B, prefix = 4, [3, 0]
    k, v, r2t, rpi, kv_slots = paged_pool(prefix, B)
    q, table = torch.randn(2 * B, 9, 64), attention.slot_table(r2t, rpi, max(prefix) + B)
    before = attention.verify_attention(q, k[0], v[0], table, torch.tensor(prefix), 0.125)
    k[0, kv_slots[0][prefix[0] + 2]] += 3.0
    after = attention.verify_attention(q, k[0], v[0], table, torch.tensor(prefix), 0.125)
    assert torch.equal(after[:2], before[:2]) and torch.equal(after[B:], before[B:])
    assert (after[2:B] - before[2:B]).abs().amax(dim=(1, 2)).min() > 1e-3
