"""The pure-torch sgl_kernel stand-ins against straightforward python-loop references."""

import sys

import pytest
import torch

from sglang_dflash.cpu import sgl_kernel_cpu as S


def _rand_lens(g, bs, lo, hi):
    return torch.randint(lo, hi + 1, (bs,), generator=g)


@pytest.mark.parametrize("seed", range(5))
def test_assign_req_to_token_pool(seed):
    g = torch.Generator().manual_seed(seed)
    bs, pool_len = 4, 40
    req_to_token = torch.randint(0, 1000, (8, pool_len), generator=g, dtype=torch.int32)
    req = torch.randperm(8, generator=g)[:bs]
    start = _rand_lens(g, bs, 0, 20)
    end = start + _rand_lens(g, bs, 0, 15)  # includes empty ranges
    out = torch.randint(0, 1000, (int((end - start).sum()) + 3,), generator=g)
    ref = req_to_token.clone()
    k = 0
    for i in range(bs):
        for c in range(int(start[i]), int(end[i])):
            ref[req[i], c] = out[k]
            k += 1
    S.assign_req_to_token_pool_cpu(req, req_to_token, start, end, out, pool_len)
    assert torch.equal(req_to_token, ref)


@pytest.mark.parametrize("seed", range(5))
def test_assign_extend_cache_locs(seed):
    g = torch.Generator().manual_seed(seed)
    bs, pool_len = 5, 40
    req_to_token = torch.randint(0, 1000, (8, pool_len), generator=g, dtype=torch.int32)
    req = torch.randperm(8, generator=g)[:bs]
    start = _rand_lens(g, bs, 0, 20)
    end = start + _rand_lens(g, bs, 0, 15)
    n = int((end - start).sum())
    out = torch.full((n + 4,), -7, dtype=torch.int64)
    ref = out.clone()
    k = 0
    for i in range(bs):
        for c in range(int(start[i]), int(end[i])):
            ref[k] = req_to_token[req[i], c]
            k += 1
    S.assign_extend_cache_locs_cpu(req, req_to_token, start, end, out, pool_len)
    assert torch.equal(out, ref)  # the tail past n is untouched


@pytest.mark.parametrize("topk,num_cols", [(1, 4), (2, 3)])
def test_assign_draft_cache_locs_contiguous(topk, num_cols):
    g = torch.Generator().manual_seed(topk)
    bs, pool_len = 3, 32
    req_to_token = torch.randint(0, 1000, (6, pool_len), generator=g, dtype=torch.int32)
    req = torch.tensor([4, 0, 2])
    seq_lens = torch.tensor([0, 7, 20])
    out = torch.empty(bs * topk * num_cols, dtype=torch.int64)
    ref = out.clone()
    for i in range(bs):
        for j in range(topk * num_cols):
            ref[i * topk * num_cols + j] = req_to_token[req[i], seq_lens[i] + j]
    S.assign_draft_cache_locs_contiguous_cpu(req, req_to_token, seq_lens, out, pool_len, topk, num_cols)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_copy_all_layer_kv_cache(dtype):
    g = torch.Generator().manual_seed(0)
    # Per layer K and V buffers [slots, heads, head_dim], as in MHATokenToKVPool.
    bufs = [torch.randn(50, 2, 8, generator=g).to(dtype) for _ in range(4)]
    bufs.append(torch.randn(50, 3, generator=g).to(dtype))  # another row size
    data_ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    src = torch.tensor([3, 10, 11, 12, 40])
    tgt = torch.tensor([11, 0, 12, 49, 3])  # overlaps src: reads must precede writes
    refs = [b.clone() for b in bufs]
    for r in refs:
        snapshot = r.clone()
        for s, t in zip(src.tolist(), tgt.tolist()):
            r[t] = snapshot[s]
    S.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for b, r in zip(bufs, refs):
        assert torch.equal(b, r)
    S.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt[:0], src[:0])  # no-op


def test_fill_bonus_tokens():
    g = torch.Generator().manual_seed(1)
    bs, stride = 4, 6
    accept_tokens = torch.randint(0, 500, (bs, stride), generator=g, dtype=torch.int32)
    accept_lens = torch.tensor([1, 6, 3, 2], dtype=torch.int32)
    bonus = torch.zeros(bs, dtype=torch.int64)
    ref = torch.tensor([int(accept_tokens[i, int(accept_lens[i]) - 1]) for i in range(bs)])
    S.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, stride)
    assert torch.equal(bonus, ref)


def test_fill_accept_out_cache_loc():
    g = torch.Generator().manual_seed(2)
    out_cache_loc = torch.randint(0, 1000, (12,), generator=g)
    accept_index = torch.tensor([[0, 1, -1, -1], [4, -1, -1, -1], [8, 9, 10, 11]], dtype=torch.int32)
    dst = torch.full((12,), -5, dtype=torch.int64)
    ref = dst.clone()
    k = 0
    for v in accept_index.flatten().tolist():
        if v != -1:
            ref[k] = out_cache_loc[v]
            k += 1
    S.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, dst)
    assert torch.equal(dst, ref)


@pytest.mark.parametrize("use_select", [False, True])
def test_rotate_input_ids(use_select):
    ids = torch.arange(100, 112)
    start = torch.tensor([0, 5, 5, 9])
    lens = torch.tensor([5, 0, 4, 3])
    new = torch.tensor([-1, -2, -3, -4])
    select = torch.tensor([2, 0, 7, 10]) if use_select else None
    ref = ids.clone().tolist()
    for i in range(4):
        s, n = int(start[i]), int(lens[i])
        if n == 0:
            continue
        seg = ref[s : s + n]
        ref[s : s + n] = seg[1:] + [seg[-1]]
        ref[int(select[i]) if use_select else s + n - 1] = int(new[i])
    S.rotate_input_ids_cpu(ids, start, lens, new, select)
    assert ids.tolist() == ref


def test_tree_kernels_raise():
    for fn in (S.build_tree_kernel_efficient_cpu, S.verify_tree_greedy_cpu):
        with pytest.raises(NotImplementedError):
            fn()


def test_install_is_idempotent_and_exposes_all():
    first = S.install_cpu_shims()
    assert S.install_cpu_shims() == first
    mod = sys.modules.get("sgl_kernel")
    if first:  # stand-in active (no usable real sgl_kernel on this machine)
        assert getattr(mod, "__sglang_dflash_shim__", False)
        for name in S.SHIMMED:
            assert getattr(mod, name) is getattr(S, name)
        with pytest.raises(ImportError):
            from sgl_kernel import fused_add_rmsnorm  # noqa: F401
        assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")


def test_spawned_child_gets_shims(monkeypatch):
    """SGLang's scheduler is a spawn child that imports sgl_kernel while unpickling."""
    import importlib
    import multiprocessing as mp

    if not S.install_cpu_shims():
        pytest.skip("real sgl_kernel works here")
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    # The module does `from sgl_kernel import copy_all_layer_kv_cache_cpu` at import.
    p = mp.get_context("spawn").Process(target=importlib.import_module, args=("sglang.kernels.ops.kvcache.cache_move",))
    p.start()
    p.join(120)
    assert p.exitcode == 0
