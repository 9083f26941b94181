"""Sliding-window drafters (config `layer_types` + `sliding_window`) on the torch and FlashInfer
paths against a dense reference; the drafter's cached RoPE table; nn.Module.apply on DFlash 2."""

import sys

import pytest
import torch

from sglang_dflash.pipeline.attention import TorchBlockAttention
from sglang_dflash.pipeline.block import build_block
from sglang_dflash.model.config import DrafterConfigError, parse_drafter_config
from sglang_dflash.pipeline.context_kv import DraftKVCache
from sglang_dflash.kernels import reference
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.pipeline.context_kv import write_context
from sglang_dflash.testing.dense_drafter import dense_reference
from sglang_dflash.testing.fake_flashinfer import FakePrefillWrapper
from sglang_dflash.testing.tiny_config import tiny_cfg_dict

MIXED = ["sliding_attention", "full_attention", "sliding_attention"]  # some layers full, some sliding
D2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}


def cfg_dict(dflash: dict | None = None, **kw):
    return tiny_cfg_dict(layers=3, dflash=dflash, **kw)


def random_drafter(cfg):
    torch.manual_seed(0)
    model = DFlashDrafter(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, mean=1.0 if p.dim() == 1 else 0.0, std=0.3)
    return model


def test_layer_windows_parsed():
    def windows(**kw):
        return parse_drafter_config(cfg_dict(**kw), 4).layer_windows

    assert windows(layer_types=MIXED, sliding_window=6) == [6, None, 6]
    assert windows() == [None] * 3
    assert windows(layer_types=MIXED, sliding_window=6, use_sliding_window=True) == [6, None, 6]
    # HF Qwen3: use_sliding_window false turns the window off; without layer_types the layers from
    # max_window_layers on slide
    assert windows(layer_types=MIXED, sliding_window=6, use_sliding_window=False) == [None] * 3
    assert windows(use_sliding_window=True, sliding_window=6, max_window_layers=1) == [None, 6, 6]
    assert windows(sliding_window=6) == [None] * 3


def test_rope_theta_from_rope_parameters():
    """transformers 5 / z-lab's newer drafters write rope_parameters, not rope_theta."""
    cfg = cfg_dict(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    cfg.pop("rope_theta", None)
    assert parse_drafter_config(cfg, 4).rope_theta == 500000.0
    cfg = cfg_dict(rope_parameters={"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0})
    cfg.pop("rope_theta", None)
    with pytest.raises(DrafterConfigError, match="rope"):
        parse_drafter_config(cfg, 4)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"layer_types": MIXED}, "sliding_window"),
        ({"layer_types": MIXED, "sliding_window": None}, "sliding_window"),
        ({"layer_types": MIXED, "sliding_window": 0}, "sliding_window"),
        ({"layer_types": MIXED, "sliding_window": "4k"}, "sliding_window"),
        ({"layer_types": MIXED[:2], "sliding_window": 6}, "layer_types"),
        ({"layer_types": ["full_attention", "chunked_attention", "full_attention"]}, "layer_types"),
    ],
)
def test_bad_window_config_names_field(change, field):
    with pytest.raises(DrafterConfigError, match=field):
        parse_drafter_config(cfg_dict(**change), 4)


def paged_setup(model, lens, B, num_slots=96):
    """Context of each request written to a paged draft KV at scattered slots, then its block's slots."""
    cfg = model.cfg
    cache = DraftKVCache(cfg.num_layers, num_slots, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
    slots = torch.randperm(num_slots, generator=torch.Generator().manual_seed(1))
    feats = [torch.randn(n, cfg.num_context_layers * cfg.hidden_size) for n in lens]
    kv_slots, at = [], 0
    for f in feats:
        kv_slots.append(slots[at : at + f.shape[0] + B])  # [prefix + B]: slot of position 0, 1, ...
        write_context(model, cache, f, torch.arange(f.shape[0]), kv_slots[-1][: f.shape[0]])
        at += f.shape[0] + B
    block_slots = torch.cat([s[-B:] for s in kv_slots])  # [bs*B]
    return cache, feats, kv_slots, block_slots


@pytest.mark.parametrize("window", [2, 4, 6])  # 2 < B: late queries still see the whole block
def test_sliding_window_draft_matches_dense_reference(window):
    cfg = parse_drafter_config(cfg_dict(layer_types=MIXED, sliding_window=window), 4)
    model = random_drafter(cfg)
    emb = torch.nn.Embedding(50, 32)
    lens, B = [5, 9, 13], 4  # every context is longer than the window
    cache, feats, kv_slots, block_slots = paged_setup(model, lens, B)
    ids, pos = build_block(torch.tensor([3, 4, 5]), torch.tensor(lens), B, 49)
    attend = TorchBlockAttention(cache.k, cache.v, kv_slots, block_slots, 8**-0.5, cfg.layer_windows)
    with torch.inference_mode():
        got = model(emb(ids.reshape(-1)), pos.reshape(-1), attend, B).view(len(lens), B, -1)
        for i, n in enumerate(lens):
            want = dense_reference(model, feats[i], torch.arange(n), emb(ids[i]), pos[i], cfg.layer_windows)
            full = dense_reference(model, feats[i], torch.arange(n), emb(ids[i]), pos[i])
            torch.testing.assert_close(got[i], want, rtol=1e-4, atol=1e-4)
            assert (want - full).abs().max() > 1e-2  # the window really hides keys in this case


def test_flashinfer_windows_match_torch_path(monkeypatch):
    """FlashInferBlockAttention plans one wrapper per distinct window with window_left = W - 1 and
    sends each layer to its own: same result as the torch path, on a FlashInfer stand-in."""
    from sglang_dflash.pipeline import flashinfer_attention as fa

    planned = {}
    monkeypatch.setattr(
        fa, "_wrapper", lambda dev, left, backend, fixed=None: planned.setdefault(left, FakePrefillWrapper(fixed))
    )
    torch.manual_seed(2)
    L, B, hkv, d, lens = 3, 4, 2, 8, [5, 11]
    windows = [6, None, 4]
    kv_slots = list(torch.randperm(64)[: sum(lens) + 2 * B].split([lens[0] + B, lens[1] + B]))
    req_to_token = torch.zeros(2, 32, dtype=torch.int32)
    for r, s in enumerate(kv_slots):
        req_to_token[r, : s.numel()] = s
    block_slots = torch.cat([s[-B:] for s in kv_slots])
    k, v = torch.randn(L, 64, hkv, d), torch.randn(L, 64, hkv, d)
    fi = fa.FlashInferBlockAttention(k.clone(), v.clone(), B, 4, d**-0.5, windows)
    fi.plan(req_to_token, torch.tensor([0, 1]), torch.tensor(lens), block_slots)
    assert sorted(planned) == [-1, 3, 5]
    ref = TorchBlockAttention(k.clone(), v.clone(), kv_slots, block_slots, d**-0.5, windows)
    for layer in range(L):
        q, kb, vb = torch.randn(2 * B, 4, d), torch.randn(2 * B, hkv, d), torch.randn(2 * B, hkv, d)
        torch.testing.assert_close(fi(layer, q, kb, vb), ref(layer, q, kb, vb), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="sliding_window"):  # W < B: FlashInfer would hide block rows
        fa.FlashInferBlockAttention(k, v, B, 4, d**-0.5, [2, None, None])


def test_the_rope_table_is_sized_once_at_start_up_and_never_by_a_draft_forward(monkeypatch):
    """A draft forward indexes the table (no host read of its positions; a captured step holds the
    table, so it must not be rebuilt later): the server sizes it once to context length + block."""
    calls = []
    original = reference.rope_cos_sin_cache

    def counting(max_pos, *args, **kw):
        calls.append(max_pos)
        return original(max_pos, *args, **kw)

    for mod in list(sys.modules.values()):  # wherever sglang_dflash imported it
        if (
            getattr(mod, "__name__", "").startswith("sglang_dflash")
            and getattr(mod, "rope_cos_sin_cache", None) is original
        ):
            monkeypatch.setattr(mod, "rope_cos_sin_cache", counting)
    rope = sys.modules.get("sglang_dflash.model.rope")
    if rope is not None:
        monkeypatch.setattr(rope, "_TABLES", {})
    model = random_drafter(parse_drafter_config(cfg_dict(), 4))
    block_only = lambda i, q, k, v: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1), v.repeat_interleave(2, 1).transpose(0, 1)
    ).transpose(0, 1)
    x = torch.randn(4, 32)
    model.rope_table(9000, "cpu")  # start-up: the context length
    assert len(calls) == 1 and calls[0] >= 9000 + 4, calls  # and the block drafted after it
    with torch.inference_mode():
        for start in (100, 200, 300, 8996):
            model(x, torch.arange(start, start + 4), block_only, 4)
    assert len(calls) == 1, calls


def test_cached_rope_rows_equal_a_fresh_table():
    from sglang_dflash.model.rope import rope_cos_sin, rope_table

    pos = torch.tensor([0, 7, 4095, 4096, 9000, 3])
    rope_table(9001, 64, 1e5, "cpu")  # sized before the forward that reads it
    cos, sin = rope_cos_sin(pos, 64, 1e5)
    fresh = reference.rope_cos_sin_cache(9001, 64, 1e5)[pos]
    torch.testing.assert_close(torch.cat([cos[:, :32], sin[:, :32]], -1), fresh, rtol=0, atol=1e-6)
    assert torch.equal(cos[:, :32], cos[:, 32:]) and torch.equal(sin[:, :32], sin[:, 32:])


def test_rope_table_built_in_inference_mode_serves_training(monkeypatch):
    from sglang_dflash.model import rope

    monkeypatch.setattr(rope, "_TABLES", {})
    pos = torch.arange(5)
    with torch.inference_mode():
        rope.rope_cos_sin(pos, 8, 1e4)  # first build, as a draft step would do it
    x = torch.randn(5, 2, 8, requires_grad=True)
    rope.apply_rope(x, *rope.rope_cos_sin(pos, 8, 1e4)).sum().backward()
    assert x.grad is not None


def test_module_apply_works_on_a_dflash2_drafter():
    """`model.apply(init_fn)` (nn.Module.apply) must reach every submodule, the convolutions included."""
    model = DFlashDrafter(parse_drafter_config(cfg_dict(dflash=D2), 4))
    seen = []

    def init(m):
        seen.append(type(m).__name__)
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.zeros_(m.weight)

    assert model.apply(init) is model
    assert seen.count("DynamicConv") == 2 * 3 and seen[-1] == "DFlashDrafter"
    assert all(not m.weight.any() for m in model.modules() if isinstance(m, torch.nn.Linear))
