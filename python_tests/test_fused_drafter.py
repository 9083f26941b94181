"""The serving drafter's fused projections (DFlashDrafter.fuse_projections): q/k/v and gate/up in one
matmul each give the unfused drafter's hidden states, the weights stay views of the fused tensors
(no second copy, checkpoints still load into them), and load_drafter serves the fused form; the
last layer's row cut (a width-W step runs the last MLP on W rows) keeps those rows' hidden states."""

import copy

import pytest
import torch
from safetensors.torch import save_file

from sglang_dflash.model.config import load_drafter_config, parse_drafter_config
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.loader import load_drafter
from sglang_dflash.pipeline.draft import propose
from sglang_dflash.testing.tiny_config import tiny_cfg_dict


def _dense_attend(layer, q, k, v):
    """Every block row sees the whole block (no context): enough to compare two drafters."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    w = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5, dim=-1)
    return torch.einsum("hqk,khd->qhd", w, v)


def _drafter(seed=0, **cfg):
    torch.manual_seed(seed)
    model = DFlashDrafter(parse_drafter_config(tiny_cfg_dict(**cfg), 4)).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return model


@torch.inference_mode()
def test_fused_projections_equal_the_unfused_drafter():
    plain = _drafter()
    fused = copy.deepcopy(plain).fuse_projections()
    x, pos = torch.randn(8, 32), torch.arange(5, 13)
    want = plain(x, pos, _dense_attend, 4)
    torch.testing.assert_close(fused(x, pos, _dense_attend, 4), want, rtol=1e-5, atol=1e-5)
    attn = fused.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == attn.qkv_weight.data_ptr()  # a view, not a copy
    # new weights written in place reach the fused matmuls
    fused.load_state_dict(_drafter(seed=1).state_dict())
    torch.testing.assert_close(fused(x, pos, _dense_attend, 4), _drafter(seed=1)(x, pos, _dense_attend, 4))
    assert not torch.allclose(fused(x, pos, _dense_attend, 4), want)


def test_load_drafter_serves_the_fused_form(tmp_path):
    import json

    model = _drafter()
    (tmp_path / "config.json").write_text(json.dumps(tiny_cfg_dict()))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    loaded = load_drafter(str(tmp_path), load_drafter_config(str(tmp_path), 4), torch.float32, "cpu")
    assert all(hasattr(layer.mlp, "gate_up_weight") for layer in loaded.layers)
    assert set(loaded.state_dict()) == set(model.state_dict())  # the fused tensors are not weights
    x, pos = torch.randn(4, 32), torch.arange(4)
    with torch.inference_mode():
        torch.testing.assert_close(loaded(x, pos, _dense_attend, 4), model(x, pos, _dense_attend, 4))


def _per_request_attend(block):
    """_dense_attend within each request's block (rows are consecutive blocks of `block`)."""

    def attend(layer, q, k, v):
        out = [
            _dense_attend(layer, *(t.view(-1, block, *t.shape[1:])[i] for t in (q, k, v)))
            for i in range(k.shape[0] // block)
        ]
        return torch.cat(out)

    return attend


@torch.inference_mode()
def test_last_layer_row_cut_keeps_the_kept_rows():
    """drafter(..., keep=W) -> the first W rows of each block, equal to the uncut forward's rows (the
    cut follows the last attention; DFlash 2's look-back convolutions see a whole prefix), and
    propose(width=W) proposes the uncut block's first W tokens."""
    block, bs = 8, 3
    dflash2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
    for model in (_drafter(block_size=block).fuse_projections(), _drafter(block_size=block, dflash=dflash2)):
        x, pos = torch.randn(bs * block, 32), torch.arange(bs * block) % block + 20
        attend = _per_request_attend(block)
        full = model(x, pos, attend, block).view(bs, block, -1)
        for keep in (1, 2, 5, block):
            cut = model(x, pos, attend, block, keep)
            assert cut.shape == (bs * keep, 32)
            torch.testing.assert_close(cut.view(bs, keep, -1), full[:, :keep], rtol=1e-5, atol=1e-5)
    model = _drafter(block_size=block).fuse_projections()
    emb, head = torch.randn(50, 32), torch.randn(50, 32)
    ids = torch.randint(0, 49, (bs, block))
    ids[:, 1:] = 49
    pos = torch.arange(block).repeat(bs, 1) + 20
    args = (model, _per_request_attend(block), lambda t: emb[t], lambda h: h @ head.t(), ids, pos)
    whole = propose(*args).tokens
    for width in (2, 4, 7):
        assert torch.equal(propose(*args, width=width).tokens, whole[:, :width])


@pytest.mark.parametrize("walk", ["chain", "best"])
@torch.inference_mode()
def test_dflash2_width_cut_drafts_the_whole_blocks_first_rows(walk):
    """A DFlash 2 drafter walking the chain drafts only the W-1 slots a width-W step verifies (the
    walk reads slot j after slot j-1's pick only); Viterbi drafts every slot. Either way the greedy
    and sampled proposals (tokens, candidates, q) are the whole block's first W rows."""
    block, bs = 8, 3
    dflash2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
    model = _drafter(block_size=block, dflash=dflash2)
    torch.nn.init.normal_(model.selector.predecessor_codebook, std=1.0)  # pair scores that matter
    model.selector.walk = walk
    emb, head = torch.randn(50, 32), torch.randn(50, 32)
    ids = torch.randint(0, 49, (bs, block))
    ids[:, 1:] = 49
    pos = torch.arange(block).repeat(bs, 1) + 20
    temps = torch.tensor([0.0, 1.0, 0.7])
    gumbel = -torch.log(torch.empty(bs, block - 1, 4).exponential_())
    args = (model, _per_request_attend(block), lambda t: emb[t], lambda h: h @ head.t(), ids, pos, temps, gumbel)
    whole = propose(*args)
    rows = []
    forward = type(model).forward

    def counting(self, x, *a, **k):
        out = forward(self, x, *a, **k)
        rows.append(out.shape[0])
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(model), "forward", counting)
        for width in (2, 4, 7):
            got, want = propose(*args, width=width).first(width), whole.first(width)
            for name in ("tokens", "cand_ids", "q", "q_rows"):
                torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-6)
    assert rows == ([bs * w for w in (2, 4, 7)] if walk == "chain" else [bs * block] * 3)


@torch.inference_mode()
def test_routed_matmuls_carry_every_projection():
    """DFlashDrafter.route_matmuls (serving: the CPU GEMM kernel): every projection of the block forward
    and the context write goes through the routed matmul, with the same hidden states; and the CPU
    router (cpu/cpu_linear.linear) runs bf16_linear where the target's GEMMs take it, F.linear elsewhere."""
    import torch.nn.functional as F

    from sglang_dflash.cpu import cpu_linear

    served = copy.deepcopy(_drafter()).fuse_projections()
    calls = []
    served.route_matmuls(lambda x, w: calls.append(tuple(w.shape)) or F.linear(x, w))
    x, pos = torch.randn(8, 32), torch.arange(5, 13)
    served2 = copy.deepcopy(_drafter()).fuse_projections()
    torch.testing.assert_close(served(x, pos, _dense_attend, 4), served2(x, pos, _dense_attend, 4), rtol=0, atol=0)
    assert len(calls) == 4 * len(served.layers)  # qkv, o, gate_up, down per layer
    calls.clear()
    served.context_kv_pre(torch.randn(3, served.fc.in_features))
    assert calls == [tuple(served.fc.weight.shape), tuple(served._kv_weight.shape)]

    x16, w16 = torch.randn(2, 64).bfloat16(), torch.randn(96, 64).bfloat16()
    try:
        assert cpu_linear.enable("cpu", torch.bfloat16) or cpu_linear.wanted("cpu", torch.bfloat16) is False
        with torch.profiler.profile() as prof:
            got = cpu_linear.linear(x16, w16)
        routed = any(e.name == "sglang_dflash::bf16_linear" for e in prof.events())
        assert routed == cpu_linear.gemm_fast(x16, w16, None)
        torch.testing.assert_close(got.float(), F.linear(x16, w16).float(), rtol=2e-2, atol=2e-2)
    finally:
        cpu_linear.enable("cpu", torch.float32)
    assert torch.equal(cpu_linear.linear(x16.float(), w16.float()), F.linear(x16.float(), w16.float()))
