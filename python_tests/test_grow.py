"""Growing a drafter deeper (train/grow.py): the grown drafter drafts exactly what its parent
drafts, from either init, and training reaches the new layers."""

import pytest
import torch

from sglang_dflash.model.config import DrafterConfigError, load_drafter_config
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.loader import load_drafter, read_state_dict
from sglang_dflash.testing.dense_drafter import dense_reference
from sglang_dflash.testing.tiny_drafter import make_tiny_drafter
from sglang_dflash.testing.tiny_models import tiny_model_cache
from sglang_dflash.train.grow import grow
from sglang_dflash.train.warm_start import warm_start


def load(path, target_layers):
    cfg = load_drafter_config(path, target_layers)
    return load_drafter(path, cfg, torch.float32, "cpu")


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    target = str(tiny_model_cache("llama", "float32"))
    path = str(tmp_path_factory.mktemp("parent"))
    make_tiny_drafter(path, target, block_size=8, num_layers=2, std=0.2)
    return target, path


@pytest.mark.parametrize("init", ["copy", "target"])
def test_grown_drafter_drafts_exactly_what_its_parent_drafts(parent, tmp_path, init):
    target, path = parent
    out = str(tmp_path / "grown")
    cfg = grow(path, out, 4, init, target)
    n_target = cfg["num_target_layers"]
    small, big = load(path, n_target), load(out, n_target)
    assert len(big.layers) == 4 and big.cfg.num_layers == 4
    g = torch.Generator().manual_seed(0)
    h = small.cfg.hidden_size
    for n in (1, 7, 30):  # context lengths
        feats = torch.randn(n, small.cfg.num_context_layers * h, generator=g)
        x = torch.randn(8, h, generator=g)  # an embedded block
        pos = torch.arange(n, n + 8)
        with torch.no_grad():
            want = dense_reference(small, feats, torch.arange(n), x, pos)
            got = dense_reference(big, feats, torch.arange(n), x, pos)
        assert torch.equal(got, want), (got - want).abs().max()
    state, parent_state = read_state_dict(out), read_state_dict(path)
    for i in (2, 3):
        assert not state[f"layers.{i}.self_attn.o_proj.weight"].any()
        assert not state[f"layers.{i}.mlp.down_proj.weight"].any()
        q = state[f"layers.{i}.self_attn.q_proj.weight"]
        if init == "copy":
            assert torch.equal(q, parent_state["layers.1.self_attn.q_proj.weight"])
        else:  # the target's last layers, in order
            src = read_state_dict(target)[f"layers.{n_target - 4 + i}.self_attn.q_proj.weight"]
            assert torch.equal(q, src)
    for k, v in parent_state.items():  # the parent's weights are untouched
        assert torch.equal(state[k], v), k


def test_training_reaches_the_new_layers(parent, tmp_path):
    target, path = parent
    out = str(tmp_path / "grown")
    cfg = grow(path, out, 3, "copy")
    dcfg = load_drafter_config(out, cfg["num_target_layers"])
    big = DFlashDrafter(dcfg)
    warm_start(big, dcfg, out, cfg["num_target_layers"])  # how `train --init-from` starts from it
    h = big.cfg.hidden_size
    feats, x = torch.randn(5, big.cfg.num_context_layers * h), torch.randn(8, h)
    dense_reference(big, feats, torch.arange(5), x, torch.arange(5, 13)).pow(2).sum().backward()
    new = big.layers[2]
    assert new.self_attn.o_proj.weight.grad.abs().sum() > 0 and new.mlp.down_proj.weight.grad.abs().sum() > 0


def test_grow_refuses_a_shallower_drafter(parent, tmp_path):
    with pytest.raises(DrafterConfigError, match="num-layers 2 must exceed"):
        grow(parent[1], str(tmp_path / "g"), 2)
