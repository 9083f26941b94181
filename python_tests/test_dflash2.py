"""DFlash 2 pieces in plain torch: the dynamic convolution, the path walk, the sampled path's q,
loading DFlash 2 checkpoints (and DFlash 1 ones unchanged), and a selector-drafted block."""

import itertools
import json

import pytest
import torch

from sglang_dflash.model.config import DrafterConfigError, load_drafter_config
from sglang_dflash.pipeline.draft import propose
from sglang_dflash.model.dynamic_conv import DynamicConv
from sglang_dflash.model.loader import load_drafter
from sglang_dflash.model.path_walk import best_path, chain_path, greedy_path, sample_path
from sglang_dflash.testing.reference import conv_reference, path_score
from sglang_dflash.testing.tiny_drafter import make_tiny_drafter
from sglang_dflash.testing.tiny_models import tiny_model_cache

D2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}


@pytest.mark.parametrize("taps,block", [(2, 4), (2, 5), (3, 8), (2, 16)])
def test_dynamic_conv_matches_loop_reference(taps, block):
    torch.manual_seed(0)
    h, group, n = 32, 8, 3 * block
    conv = DynamicConv(h, taps, group)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_(std=0.3)
    x = torch.randn(n, h)
    coef = conv.coefficients(x)  # [N, 2, taps, H]
    delta = conv.kernel_projection(x).view(n, 2, taps, h // group)
    for side in (0, 1):
        got = conv.convolve(x, coef[:, side], block)
        want = conv_reference(x, conv.base_kernel[side].detach(), delta[:, side].detach(), group, block)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # taps never cross a block start: the first row of each block ignores the previous block
    y = x.clone()
    y[block - 1] += 100.0
    assert torch.equal(conv.convolve(y, coef[:, 0], block)[block], conv.convolve(x, coef[:, 0], block)[block])


@pytest.mark.parametrize("k,p,seed", [(2, 3, 0), (3, 4, 1), (4, 3, 2), (3, 5, 3)])
def test_best_path_equals_brute_force(k, p, seed):
    g = torch.Generator().manual_seed(seed)
    edges = torch.randn(5, p, k, k, generator=g)
    edges[:, 0] = edges[:, 0, :1]  # slot 0 hangs off the anchor: every predecessor row is the same
    got = best_path(edges)
    for b in range(edges.shape[0]):
        paths = torch.tensor(list(itertools.product(range(k), repeat=p)))
        scores = path_score(edges[b : b + 1].expand(len(paths), -1, -1, -1), paths)
        assert torch.equal(got[b], paths[scores.argmax()]), (got[b], paths[scores.argmax()])
        assert torch.isclose(path_score(edges[b : b + 1], got[b : b + 1])[0], scores.max())


def test_chain_path_is_the_sampled_walks_cold_limit():
    """chain: slot by slot the best candidate after the previous pick, which is what the sampled walk
    draws as T -> 0 (no noise); greedy_path dispatches on the checkpoint's selector_walk."""
    g = torch.Generator().manual_seed(4)
    edges = torch.randn(6, 5, 4, 4, generator=g)
    edges[:, 0] = edges[:, 0, :1]
    got = chain_path(edges)
    cold, _ = sample_path(edges, torch.full((6,), 1e-4), torch.zeros(6, 5, 4))
    assert torch.equal(got, cold)
    for b in range(6):  # the definition, one request at a time
        prev = 0
        for j in range(5):
            prev = int(edges[b, j, prev].argmax())
            assert got[b, j] == prev
    assert torch.equal(greedy_path(edges, "chain"), got) and torch.equal(greedy_path(edges, "best"), best_path(edges))


def test_sampled_path_draws_from_its_q():
    """The empirical frequency of each slot-1 candidate given slot 0 matches the q it reports."""
    g = torch.Generator().manual_seed(0)
    k, p, n = 3, 2, 40000
    edges = torch.randn(1, p, k, k, generator=g).expand(n, -1, -1, -1).clone()
    edges[:, 0] = edges[:, 0, :1]
    gumbel = -torch.log(torch.empty(n, p, k).exponential_())
    idx, q = sample_path(edges, torch.full((n,), 0.7), gumbel)
    want0 = torch.softmax(edges[0, 0, 0] / 0.7, -1)
    torch.testing.assert_close(q[0, 0], want0)
    freq0 = torch.bincount(idx[:, 0], minlength=k).float() / n
    assert (freq0 - want0).abs().max() < 0.01
    for a in range(k):
        rows = idx[:, 0] == a
        want = torch.softmax(edges[0, 1, a] / 0.7, -1)
        torch.testing.assert_close(q[rows, 1], want.expand(int(rows.sum()), -1))
        freq = torch.bincount(idx[rows, 1], minlength=k).float() / rows.sum()
        assert (freq - want).abs().max() < 0.02


@pytest.fixture(scope="module")
def target():
    return str(tiny_model_cache("llama", "float32"))


def test_dflash2_checkpoint_loads_and_drafts_a_block(tmp_path, target):
    path = make_tiny_drafter(str(tmp_path / "d2"), target, block_size=4, num_layers=2, dflash2=D2)
    cfg = load_drafter_config(path, 4)
    assert cfg.dflash2 is not None and cfg.dflash2.selector_top_k == 4
    model = load_drafter(path, cfg, torch.float32, "cpu")
    assert model.selector is not None and hasattr(model.layers[0], "attention_conv")
    emb = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    ctx = torch.randn(6, cfg.num_kv_heads, cfg.head_dim)

    def attend(layer, q, k, v):  # every query sees the block's own rows plus a fixed context
        from sglang_dflash.pipeline.attention import attend_rows

        out = torch.empty_like(q)
        for r in range(0, q.shape[0], 4):
            out[r : r + 4] = attend_rows(
                q[r : r + 4], torch.cat([ctx, k[r : r + 4]]), torch.cat([ctx, v[r : r + 4]]), cfg.head_dim**-0.5
            )
        return out

    ids = torch.tensor([[5, 383, 383, 383], [7, 383, 383, 383]])
    pos = torch.tensor([[6, 7, 8, 9], [6, 7, 8, 9]])
    head = lambda h: h @ emb.weight.t()  # noqa: E731
    greedy = propose(model, attend, emb, head, ids, pos)
    assert greedy.q is None and greedy.tokens.shape == (2, 4) and torch.equal(greedy.tokens[:, 0], ids[:, 0])
    assert bool((greedy.cand_ids.gather(2, torch.zeros(2, 3, 1, dtype=torch.long)) >= 0).all())
    gumbel = -torch.log(torch.empty(2, 3, 4).exponential_())
    sampled = propose(model, attend, emb, head, ids, pos, torch.tensor([0.0, 1.0]), gumbel)
    assert torch.equal(sampled.tokens[0], greedy.tokens[0])  # greedy rows keep the best path
    assert sampled.q.shape == (2, 3, 4) and torch.allclose(sampled.q.sum(-1), torch.ones(2, 3))
    for j in range(3):  # each sampled proposal is one of its slot's candidates
        assert int(sampled.tokens[1, j + 1]) in sampled.cand_ids[1, j].tolist()


def test_dflash1_checkpoint_still_loads_without_dflash2_weights(tmp_path, target):
    path = make_tiny_drafter(str(tmp_path / "d1"), target, block_size=4)
    cfg = load_drafter_config(path, 4)
    model = load_drafter(path, cfg, torch.float32, "cpu")
    assert cfg.dflash2 is None and model.selector is None and not hasattr(model.layers[0], "mlp_conv")


@pytest.mark.parametrize(
    "change,field",
    [
        ({"selector_top_k": None}, "selector_top_k"),
        ({"conv_group_size": 7}, "conv_group_size"),
        ({"selector_rank": 0}, "selector_rank"),
        ({"selector_walk": "beam"}, "selector_walk"),
    ],
)
def test_bad_dflash2_config_names_the_field(tmp_path, target, change, field):
    path = make_tiny_drafter(str(tmp_path / "bad"), target, block_size=4, dflash2=D2)
    with open(f"{path}/config.json") as f:
        cfg = json.load(f)
    for k, v in change.items():
        if v is None:
            del cfg["dflash_config"][k]
        else:
            cfg["dflash_config"][k] = v
    with open(f"{path}/config.json", "w") as f:
        json.dump(cfg, f)
    with pytest.raises(DrafterConfigError, match=field):
        load_drafter_config(path, 4)


def test_dflash2_checkpoint_missing_selector_weights_fails(tmp_path, target):
    from safetensors.torch import load_file, save_file

    path = make_tiny_drafter(str(tmp_path / "d2"), target, block_size=4, dflash2=D2)
    w = load_file(f"{path}/model.safetensors")
    del w["candidate_selector.successor_codebook"]
    save_file(w, f"{path}/model.safetensors")
    with pytest.raises(DrafterConfigError, match="successor_codebook"):
        load_drafter(path, load_drafter_config(path, 4), torch.float32, "cpu")
