"""The draft step's block attention under step graphs (FlashInfer's CUDA-graph mode, on its CPU
stand-in): planned outside the captured step into one bucket's fixed buffers, re-planned before
every replay, and the same output as the unfixed attention at every batch size (1, a bucket
edge, padded up to a bucket, above the largest bucket)."""

import pytest
import torch

from sglang_dflash.model.config import parse_drafter_config
from sglang_dflash.pipeline import attention_choice, flashinfer_attention as fa
from sglang_dflash.pipeline.context_kv import DraftKVCache
from sglang_dflash.pipeline.step_graphs import StepGraphs
from sglang_dflash.testing.fake_flashinfer import FakePrefillWrapper
from sglang_dflash.testing.fake_graphs import FakeGraphs
from sglang_dflash.testing.tiny_config import tiny_cfg_dict

B, SLOTS, WIDTH = 4, 256, 40  # block, KV slots, request-pool row width


class Wrapper(FakePrefillWrapper):
    made: list = []

    def __init__(self, fixed=None):
        super().__init__(fixed)
        Wrapper.made.append(None if fixed is None else len(fixed["qo_indptr_buf"]) - 1)

    def plan(self, *args, **kw):
        assert not FakeGraphs.capturing, "FlashInfer's plan ran inside a captured step"
        super().plan(*args, **kw)


def setup(bs_max=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = parse_drafter_config(tiny_cfg_dict(), 4)
    kv = DraftKVCache(cfg.num_layers, SLOTS, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, "cpu")
    kv.k.copy_(torch.randn(kv.k.shape, generator=g))
    kv.v.copy_(torch.randn(kv.v.shape, generator=g))
    req_to_token = torch.zeros(bs_max + 1, WIDTH, dtype=torch.int32)
    perm = torch.randperm(SLOTS - 1, generator=g) + 1  # slot 0 is SGLang's padding slot
    req_to_token[1:] = perm[: bs_max * WIDTH].view(bs_max, WIDTH)
    return cfg, kv, req_to_token, g


def batch(bs, req_to_token, g):
    rows = torch.arange(1, bs + 1)
    prefix = torch.randint(1, WIDTH - B, (bs,), generator=g)
    slots = torch.stack([req_to_token[r, p : p + B].long() for r, p in zip(rows.tolist(), prefix.tolist())])
    return rows, prefix, slots  # [bs], [bs], [bs, B]


@pytest.mark.parametrize("flashinfer", [True, False])  # False: the torch path (the CPU twin), re-planned in place
def test_block_attention_planned_outside_the_graph_equals_unfixed_attention(monkeypatch, flashinfer):
    sizes = (1, 2, 3, 5)
    Wrapper.made = []
    monkeypatch.setattr(fa, "_wrapper", lambda dev, left, backend, fixed=None: Wrapper(fixed))
    cfg, kv, req_to_token, g = setup()
    heads, d = cfg.num_heads, cfg.head_dim

    def plan(attend, fixed, pool_rows, prefix, slots, q, kb):
        args = (cfg, B, flashinfer, kv, req_to_token, pool_rows, prefix, slots.reshape(-1))
        return attention_choice.block_attention(*args, reuse=attend, fixed=fixed)

    def step(attend, pool_rows, prefix, slots, q, kb):  # q [bs, B, H, D]; kb [bs, B, Hkv, D]
        n = q.shape[0] * B
        outs = [attend(layer, q.reshape(n, heads, d), kb.reshape(n, -1, d), kb.reshape(n, -1, d)) for layer in range(2)]
        return (torch.stack(outs, 1).view(q.shape[0], B, len(outs), heads, d),)  # [bs, B, L, H, D]

    graphs = StepGraphs([2, 4], FakeGraphs())
    pads = dict(pool_rows=0, prefix=0, slots=0, q=0.0, kb=0.0)
    for rep in range(2):
        for bs in sizes:
            rows, prefix, slots = batch(bs, req_to_token, g)
            q = torch.randn(bs, B, heads, d, generator=g).bfloat16()
            kb = torch.randn(bs, B, cfg.num_kv_heads, d, generator=g).bfloat16()
            inp = dict(pool_rows=rows, prefix=prefix, slots=slots, q=q, kb=kb)
            got = graphs.run(step, inp, pads, prepare=plan)[0]
            want = step(plan(None, False, **inp), **inp)[0]
            assert torch.equal(got, want), (rep, bs)
    assert graphs.counts == {"captured": 2, "replayed": 6, "fallback:batch above the largest bucket": 2}
    fixed = [m for m in Wrapper.made if m is not None]
    if flashinfer:
        assert sorted(set(fixed)) == [2, 4] and len(fixed) == 2, Wrapper.made  # one wrapper per bucket, kept
    else:
        assert Wrapper.made == []


def test_fixed_attention_refuses_another_batch_size_and_sizes_its_index_buffer(monkeypatch):
    seen = []
    monkeypatch.setattr(fa, "_wrapper", lambda dev, left, backend, fixed=None: seen.append(fixed) or Wrapper(fixed))
    cfg, kv, req_to_token, g = setup()
    rows, prefix, slots = batch(2, req_to_token, g)
    attend = attention_choice.block_attention(
        cfg, B, True, kv, req_to_token, rows, prefix, slots.reshape(-1), fixed=True
    )
    assert seen[0]["paged_kv_indices_buf"].numel() == 2 * (WIDTH + B)  # every request at its longest
    rows, prefix, slots = batch(3, req_to_token, g)
    with pytest.raises(ValueError, match="fixed for batch size 2 planned for 3"):
        attend.plan(req_to_token, rows, prefix, slots.reshape(-1))


def test_the_workspace_grows_for_a_large_captured_batch_and_earlier_wrappers_keep_theirs(monkeypatch):
    monkeypatch.setattr(fa, "_WORKSPACE", {})
    dev = torch.device("cpu")
    small = fa._workspace(dev)
    assert small.numel() == 128 * 1024 * 1024 and fa._workspace(dev, 1024) is small
    need = [fa.graph_workspace_bytes(bs, 16, 32, 8, 128, 132) for bs in (1, 16, 48, 64, 256)]
    assert need == sorted(need) and need[-1] > small.numel()  # split-kv scratch grows with the batch
    big = fa._workspace(dev, need[-1])
    assert big.numel() == need[-1] and big is not small and fa._workspace(dev) is big
