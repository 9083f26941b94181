"""csrc/ ops: schema, opcheck, and the C++ CPU kernels against the torch references."""

import os
import subprocess
import sys

import pytest
import torch

from sglang_dflash import kernels
from sglang_dflash.kernels.reference import linear_verify_accept_ref, rope_cos_sin_cache, write_draft_kv_ref

OPS = kernels.ops()


def test_extension_is_built_and_schema_matches():
    assert kernels.load() == "extension", "the C++ extension must be built (pip install -e . builds it)"
    for name, schema in kernels.SCHEMAS.items():
        got = str(getattr(OPS, name).default._schema)
        assert got == f"sglang_dflash::{name}{schema}", got


def make_write_case(L=3, T=7, H=2, D=64, pages=8, page=16, dtype=torch.bfloat16, cache_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = pages * page
    k = torch.randn(L, T, H, D, generator=g).to(dtype)
    v = torch.randn(L, T, H, D, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(L, D, generator=g)).to(dtype)
    cs = rope_cos_sin_cache(4096, D, 1e6)
    pos = torch.randint(0, 4096, (T,), generator=g)
    slots = torch.randperm(S, generator=g)[:T]
    cache_dtype = cache_dtype or dtype
    # a paged buffer [L, pages, page, H, D] viewed flat as [L, S, H, D]: slot = page_id * page + offset
    kc = torch.zeros(L, pages, page, H, D).to(cache_dtype).view(L, S, H, D)
    vc = torch.zeros_like(kc)
    return k, v, w, cs, pos, slots, kc, vc


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("neox", [True, False])
def test_write_draft_kv_matches_reference(dtype, D, page, neox):
    k, v, w, cs, pos, slots, kc, vc = make_write_case(D=D, page=page, pages=max(1, 128 // page), dtype=dtype)
    kr, vr = kc.clone(), vc.clone()
    OPS.write_draft_kv(k, v, w, cs, pos, slots, kc, vc, 1e-6, neox, 1.0)
    write_draft_kv_ref(k, v, w, cs, pos, slots, kr, vr, 1e-6, neox)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(kc.float(), kr.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(vc.float(), vr.float(), rtol=0, atol=0)
    untouched = torch.ones(kc.shape[1], dtype=torch.bool)
    untouched[slots] = False
    assert (kc[:, untouched] == 0).all()


def test_write_draft_kv_fp8_with_scale():
    k, v, w, cs, pos, slots, kc, vc = make_write_case(dtype=torch.float32, cache_dtype=torch.float8_e4m3fn)
    kr, vr = kc.clone(), vc.clone()
    OPS.write_draft_kv(k, v, w, cs, pos, slots, kc, vc, 1e-6, True, 0.5)
    write_draft_kv_ref(k, v, w, cs, pos, slots, kr, vr, 1e-6, True, kv_scale=0.5)
    torch.testing.assert_close(kc.float(), kr.float(), rtol=0.07, atol=0.02)
    torch.testing.assert_close(vc.float(), vr.float())


def test_write_draft_kv_empty_and_errors():
    k, v, w, cs, pos, slots, kc, vc = make_write_case(T=0)
    OPS.write_draft_kv(k, v, w, cs, pos, slots, kc, vc, 1e-6, True, 1.0)
    assert (kc == 0).all()
    k, v, w, cs, pos, slots, kc, vc = make_write_case(T=2)
    with pytest.raises(RuntimeError, match="slot"):
        OPS.write_draft_kv(k, v, w, cs, pos, torch.tensor([0, 10**6]), kc, vc, 1e-6, True, 1.0)


def test_write_draft_kv_bad_slot_names_slot_and_pool_size():
    # csrc/dflash_checks.h, shared by the CPU and CUDA ops: checked before any write, never a silent
    # out-of-bounds store; the message names the bad slot id and the KV pool's size (S = 8 * 16).
    k, v, w, cs, pos, slots, kc, vc = make_write_case(T=2)
    for bad in (10**6, 128, -1):
        with pytest.raises(RuntimeError, match=rf"slot {bad} out of range \[0, 128\): the KV pool has 128 slots"):
            OPS.write_draft_kv(k, v, w, cs, pos, torch.tensor([0, bad]), kc, vc, 1e-6, True, 1.0)
        assert (kc == 0).all() and (vc == 0).all()
    with pytest.raises(RuntimeError, match=r"position 4096 out of range \[0, 4096\): cos_sin_cache has 4096 rows"):
        OPS.write_draft_kv(k, v, w, cs, torch.tensor([4096, 0]), slots, kc, vc, 1e-6, True, 1.0)
    with pytest.raises(RuntimeError, match="k and v dtypes differ"):
        OPS.write_draft_kv(k, v.float(), w, cs, pos, slots, kc, vc, 1e-6, True, 1.0)
    with pytest.raises(RuntimeError, match="k_cache and v_cache dtypes differ"):
        OPS.write_draft_kv(k, v, w, cs, pos, slots, kc, vc.float(), 1e-6, True, 1.0)
    assert (kc == 0).all() and (vc == 0).all()


def test_write_draft_kv_reference_checks_slots_alike():
    k, v, w, cs, pos, slots, kc, vc = make_write_case(T=2)
    with pytest.raises(RuntimeError, match=r"slot -1 out of range \[0, 128\): the KV pool has 128 slots"):
        write_draft_kv_ref(k, v, w, cs, pos, torch.tensor([0, -1]), kc, vc, 1e-6, True)
    assert (kc == 0).all()


def test_write_draft_kv_strided_slots_and_positions():
    # A strided view of slots/positions must be read by index, not as raw memory.
    k, v, w, cs, pos, slots, kc, vc = make_write_case(T=5)
    wide_slots = torch.stack([slots, torch.full_like(slots, 10**6)], dim=1)  # [T, 2]; column 0 is a view
    wide_pos = torch.stack([pos, torch.full_like(pos, 10**6)], dim=1)
    kr, vr = kc.clone(), vc.clone()
    OPS.write_draft_kv(k, v, w, cs, wide_pos[:, 0], wide_slots[:, 0], kc, vc, 1e-6, True, 1.0)
    OPS.write_draft_kv(k, v, w, cs, pos, slots, kr, vr, 1e-6, True, 1.0)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)


def test_write_draft_kv_opcheck():
    args = make_write_case(T=3)
    torch.library.opcheck(OPS.write_draft_kv, (*args, 1e-6, True, 1.0))


def accept_case(bs=5, B=8, seed=0, S=2):
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 6, (bs, B), generator=g)
    draft = torch.randint(0, 6, (bs, B), generator=g)
    agree = torch.rand(bs, B, generator=g) < 0.7
    draft[:, 1:] = torch.where(agree[:, 1:], target[:, :-1], draft[:, 1:])
    prefix = torch.randint(0, 100, (bs,), generator=g)
    budget = torch.randint(1, B + 3, (bs,), generator=g)
    stops = torch.randint(0, 12, (bs, S), generator=g)
    stops[stops >= 6] = -1
    return draft, target, prefix, budget, stops


@pytest.mark.parametrize("seed", range(20))
def test_linear_verify_accept_matches_reference(seed):
    case = accept_case(seed=seed, bs=1 + seed % 7, B=[2, 4, 8, 16][seed % 4])
    for got, want in zip(OPS.linear_verify_accept(*case), linear_verify_accept_ref(*case)):
        assert torch.equal(got, want)


def test_linear_verify_accept_edges():
    draft = torch.tensor([[9, 1, 2, 3], [9, 1, 2, 3], [9, 1, 2, 3]])
    target = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    prefix = torch.tensor([10, 20, 30])
    budget = torch.tensor([100, 2, 100])
    stops = torch.tensor([[-1], [-1], [1]])  # request 2: stop token at position 0
    acc, bonus, commit, seq, out = OPS.linear_verify_accept(draft, target, prefix, budget, stops)
    assert acc.tolist() == [3, 3, 3] and bonus.tolist() == [4, 2, 1]
    assert commit.tolist() == [4, 2, 1] and seq.tolist() == [14, 22, 31]
    assert out.tolist() == [[1, 2, 3, 4], [1, 2, -1, -1], [1, -1, -1, -1]]
    empty = [torch.empty(0, 4, dtype=torch.long)] * 2 + [torch.empty(0, dtype=torch.long)] * 2
    assert OPS.linear_verify_accept(*empty, torch.empty(0, 1, dtype=torch.long))[0].numel() == 0


def test_linear_verify_accept_opcheck():
    torch.library.opcheck(OPS.linear_verify_accept, accept_case())


def test_reference_fallback_registers_same_ops():
    code = (
        "import torch; from sglang_dflash import kernels; assert kernels.load() == 'reference';"
        "from sglang_dflash.kernels.reference import *;"
        "t = torch.tensor([[1, 2], [3, 4]]);"
        "print(torch.ops.sglang_dflash.linear_verify_accept(t, t, t[:, 0], t[:, 0], t[:, :1])[2].tolist())"
    )
    env = {**os.environ, "SGLANG_DFLASH_REFERENCE_OPS": "1"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "using the torch reference ops" in p.stderr and p.stdout.strip() == "[1, 1]"
