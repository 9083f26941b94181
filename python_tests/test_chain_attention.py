"""csrc/cpu/chain_attention_cpu.cpp: the paged block attention op (causal: the target's verify chain;
not causal: the drafter's block) against its torch reference (float32 and bf16, GQA and MHA, one and
many rows a request, ragged prefixes, a prefix of 0), against the gather + SDPA path it replaces,
opcheck, bad input, and the causal rule (a later block row's K/V never reaches an earlier row)."""

import pytest
import torch

from sglang_dflash import kernels
from sglang_dflash.kernels.reference import chain_attention_ref
from sglang_dflash.pipeline import attention

OPS = kernels.ops()


def case(prefix, B, H=9, Hkv=3, D=64, dtype=torch.float32, S=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(S, Hkv, D, generator=g).to(dtype)
    v = torch.randn(S, Hkv, D, generator=g).to(dtype)
    T = max(prefix) + B + 3
    slots = torch.stack([torch.randperm(S, generator=g)[:T] for _ in prefix])
    q = torch.randn(len(prefix) * B, H, D, generator=g).to(dtype)
    return q, k, v, slots, torch.tensor(prefix, dtype=torch.int64)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 4, 16])
@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 4, 32), (8, 2, 80)])
def test_matches_the_reference(causal, dtype, B, heads):
    H, Hkv, D = heads
    q, k, v, slots, prefix = case([300, 0, 17], B, H, Hkv, D, dtype)
    got = OPS.chain_attention(q, k, v, slots, prefix, D**-0.5, causal)
    want = chain_attention_ref(q, k, v, slots, prefix, D**-0.5, causal)
    assert got.dtype == dtype and got.shape == q.shape
    tol = dict(rtol=0, atol=2e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got.float(), want.float(), **tol)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B", [1, 2, 4, 16])
@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 4, 32), (8, 2, 80), (4, 2, 128)])
def test_bf16_is_the_float32_attention_rounded_once(causal, B, heads):
    """bf16 (native bf16 dot products where the CPU has AVX512-BF16, head dims 32/64/128; the generic
    kernel otherwise) equals the float32 kernel on the same bf16 values within one bf16 rounding of
    the output: the scores and the weighted sum lose nothing in bf16 arithmetic."""
    H, Hkv, D = heads
    q, k, v, slots, prefix = case([300, 0, 17, 64], B, H, Hkv, D, torch.bfloat16, seed=B)
    got = OPS.chain_attention(q, k, v, slots, prefix, D**-0.5, causal).float()
    want = OPS.chain_attention(q.float(), k.float(), v.float(), slots, prefix, D**-0.5, causal)
    err = (got - want).abs() - want.abs() * 2**-8  # half a bf16 step of the value, plus fp32 slack
    assert err.max() <= 1e-5, f"bf16 off the float32 result by more than its rounding: {err.max():.3g}"


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B", [1, 8, 16])
def test_matches_the_gather_and_sdpa_path(B, causal):
    q, k, v, slots, prefix = case([250, 40, 3, 129], B)
    plan = attention.plan_rows(slots, prefix, B, prefix.tolist(), causal=causal)
    want = attention.attend_plan(plan, q, k, v, 0.125)
    got = OPS.chain_attention(q, k, v, slots, prefix, 0.125, causal)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)


def test_causal_within_the_block():
    """Changing block row 2's K/V moves rows 2.. of that request only."""
    B = 4
    q, k, v, slots, prefix = case([5, 9], B)
    before = OPS.chain_attention(q, k, v, slots, prefix, 0.125, True)
    k[slots[0, 5 + 2]] += 3.0
    after = OPS.chain_attention(q, k, v, slots, prefix, 0.125, True)
    assert torch.equal(after[:2], before[:2]) and torch.equal(after[B:], before[B:])
    assert (after[2:B] - before[2:B]).abs().amax(dim=(1, 2)).min() > 1e-3


def test_empty_and_opcheck():
    q, k, v, slots, prefix = case([7, 2], 2)
    assert OPS.chain_attention(q[:0], k, v, slots[:0], prefix[:0], 0.125, True).shape == (0, 9, 64)
    torch.library.opcheck(OPS.chain_attention, (q, k, v, slots, prefix, 0.125, False))


def test_bad_input_names_the_field():
    q, k, v, slots, prefix = case([7, 2], 2)
    with pytest.raises(RuntimeError, match="one dtype"):
        OPS.chain_attention(q.bfloat16(), k, v, slots, prefix, 0.125, True)
    with pytest.raises(RuntimeError, match="prefix"):
        OPS.chain_attention(q, k, v, slots, prefix + 100, 0.125, True)
    bad = slots.clone()
    bad[0, 0] = k.shape[0]
    with pytest.raises(RuntimeError, match="outside the cache"):
        OPS.chain_attention(q, k, v, bad, prefix, 0.125, True)
    with pytest.raises(RuntimeError, match="int64"):
        OPS.chain_attention(q, k, v, slots.int(), prefix, 0.125, True)


def test_routing_few_rows_one_dtype_unless_turned_off(monkeypatch):
    q, k, v, _, _ = case([7], 1)
    rows = attention.FUSED_MAX_ROWS
    assert attention.fused(q, k, v, 1) and attention.fused(q, k, v, rows)
    assert not attention.fused(q, k, v, rows + 1)  # several query rows: SDPA's tiled GEMMs win
    assert not attention.fused(q.bfloat16(), k, v, 1)
    monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "attention=0")
    assert not attention.fused(q, k, v, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 4])
def test_any_thread_split_gives_the_same_bits(dtype, B):
    """Units are taken longest prefix first by whichever thread is free: one and two threads, ragged
    prefixes (their order unsorted), the same output bit for bit, causal and not."""
    q, k, v, slots, prefix = case([5, 300, 0, 17, 200, 64, 1, 90], B, dtype=dtype, seed=7)
    before = torch.get_num_threads()
    try:
        for causal in (True, False):
            outs = []
            for n in (1, 2):
                torch.set_num_threads(n)
                outs.append(OPS.chain_attention(q, k, v, slots, prefix, 0.125, causal))
            assert torch.equal(outs[0], outs[1])
            want = chain_attention_ref(q, k, v, slots, prefix, 0.125, causal)
            tol = dict(rtol=0, atol=2e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
            torch.testing.assert_close(outs[1].float(), want.float(), **tol)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("prefix", [[300], [5, 300]])
@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 4, 32), (8, 2, 128)])
def test_a_request_split_over_threads_gives_the_same_bits(prefix, heads):
    """With fewer (request, KV head) units than threads x 4, bf16 on native dot products splits each
    unit into chunks of whole passes (one 16-row verify: 3 units, 2 threads): 1 thread (no split),
    2 and 3 threads (different splits), the same bits, causal and not."""
    H, Hkv, D = heads
    q, k, v, slots, pre = case(prefix, 16, H=H, Hkv=Hkv, D=D, dtype=torch.bfloat16, seed=5)
    before = torch.get_num_threads()
    try:
        for causal in (True, False):
            outs = []
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                outs.append(OPS.chain_attention(q, k, v, slots, pre, 0.125, causal))
            assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), causal
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B", [2, 3, 4])
def test_rows_a_pass_leave_the_bits(causal, B):
    """bf16, head dim 64: more than 4 query rows a (request, KV head) walk the keys 6 rows a pass (3
    query heads a KV head, B rows), 4 rows or fewer 4 a pass. Each query head alone over a copy of its
    KV head (one query head a KV head: B rows, the 4-row pass for B <= 4) gives the same bits."""
    q, k, v, slots, prefix = case([5, 300, 0, 17, 200, 64], B, dtype=torch.bfloat16, seed=11)
    got = OPS.chain_attention(q, k, v, slots, prefix, 0.125, causal)
    for h in range(9):
        g = h // 3
        k1, v1 = k[:, [g]].contiguous(), v[:, [g]].contiguous()
        one = OPS.chain_attention(q[:, [h]].contiguous(), k1, v1, slots, prefix, 0.125, causal)
        assert torch.equal(got[:, h], one[:, 0]), h
