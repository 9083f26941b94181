"""DFlash 2 training (train/dflash2.py): a DFlash 1 drafter upgraded in place drafts exactly what it
drafted; the selector's loss is the q serving samples from and trains the pair scores the chain
walk reads (and Viterbi would not follow); a warm-started DFlash 2 run trains the convolutions and the selector and exports a
checkpoint the server's loader accepts."""

import json
import os

import pytest
import torch

from sglang_dflash.model.checkpoint import load_exported
from sglang_dflash.model.config import load_drafter_config
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.loader import load_drafter, read_state_dict
from sglang_dflash.model.path_walk import sample_path
from sglang_dflash.model.selector import CandidateSelector
from sglang_dflash.testing.tiny_models import tiny_model_cache
from sglang_dflash.train import export, features
from sglang_dflash.model.draft_vocab import ids_from_d2t
from sglang_dflash.train.blocks import _accepted, anchor_ids, block_hidden, sample_anchors, walk_counts
from sglang_dflash.train.dflash2 import scores_after, selector_candidates, selector_drafts, selector_loss, upgrade
from sglang_dflash.train.features import load_seqs, load_target
from sglang_dflash.train.sampled_walk import PATH_RULES, sampled_walk_counts, taus

from train_helpers import _tiny_workdir, train_run


def _load(path, n_target):
    return load_drafter(path, load_drafter_config(path, n_target), torch.float32, "cpu")


def test_selector_loss_is_servings_q_and_trains_the_best_path():
    """Every token a candidate; the label is a fixed permutation of the previous token (the anchor
    for slot 0), which the logits alone do not rank first. The loss's softmax is sample_path's q at
    T=1 row for row; training the selector alone moves the best path onto the labels."""
    torch.manual_seed(0)
    n, p, h, v = 64, 3, 16, 12
    k = v
    sel = CandidateSelector(h, v, rank=8, top_k=k, walk="chain")
    with torch.no_grad():
        sel.successor_codebook.normal_(std=0.1)
        sel.hidden_projection.weight.normal_(std=0.3)
    head = torch.randn(v, h)
    hidden = 1.0 + 0.3 * torch.randn(n, p, h)  # drafter states share a direction, as normed ones do
    anchors = torch.randint(0, v, (n,))
    values, cand = selector_candidates(sel, hidden, head, None)  # [n, P, K]
    perm = torch.roll(torch.arange(v), 5)
    targets = torch.empty(n, p, dtype=torch.int64)
    prev = anchors
    for j in range(p):
        targets[:, j] = perm[prev]
        prev = targets[:, j]
    w = torch.ones(p)
    with torch.no_grad():  # the loss's rows are the q serving samples slot j from, given the true prefix
        sel.predecessor_codebook.normal_(std=0.1)
        edges = sel.edges(anchors, cand, values, hidden)  # [n, P, K, K]
        _, q = sample_path(edges, torch.ones(n), torch.zeros(n, p, k))
        prev = torch.cat([anchors[:, None], targets[:, :-1]], 1)
        rows = scores_after(sel, values, cand, prev, hidden)  # [n, P, K]
        assert torch.allclose(torch.softmax(rows[:, 0], -1), q[:, 0], atol=1e-6)  # slot 0: the anchor
        for j in range(1, p):  # the previous slot's candidate that is the true token
            a_idx = (cand[:, j - 1] == targets[:, j - 1, None]).float().argmax(-1)
            assert torch.allclose(rows[:, j], edges[torch.arange(n), j, a_idx], atol=1e-5)
        loss, covered = selector_loss(sel, hidden, anchors, targets, head, None, w)
        label = (cand == targets[..., None]).float().argmax(-1)  # [n, P] the label's candidate index
        want = torch.nn.functional.cross_entropy(rows.flatten(0, 1), label.flatten())
        assert covered == 1.0 and torch.allclose(loss, want, atol=1e-5)
        sel.predecessor_codebook.zero_()
    before = (selector_drafts(sel, hidden, anchors, head, None) == targets).all(-1).float().mean()
    opt = torch.optim.Adam(sel.parameters(), lr=0.05)
    for _ in range(300):
        loss, _ = selector_loss(sel, hidden, anchors, targets, head, None, w)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = (selector_drafts(sel, hidden, anchors, head, None) == targets).all(-1).float().mean()
    assert before < 0.3 and after > 0.95, (before, after)
    # Viterbi over the same slot-by-slot scores leaves the labels: the reason for selector_walk "chain"
    sel.walk = "best"
    assert (selector_drafts(sel, hidden, anchors, head, None) == targets).all(-1).float().mean() < after


def test_upgrade_then_dflash2_training_and_export(tmp_path):
    torch.set_num_threads(1)
    target = str(tiny_model_cache("llama", "float32"))
    wd = _tiny_workdir(tmp_path)
    features.run(wd, target, num_context_layers=1, shard_size=6, dtype=torch.float32)
    kw = dict(num_layers=1, block_size=4, anchors=8, seqs=4, ckpt_minutes=100, resume=False, eval_anchors=40)
    kw.update(command="test", draft_vocab=16)
    train_run(wd, target, steps=60, lr=1e-2, **kw)
    export.run(wd, target, str(tmp_path / "d1"), command="test", eval_anchors=40)
    cfg = upgrade(str(tmp_path / "d1"), str(tmp_path / "d2"), group=16, rank=8, top_k=4)
    n_target = cfg["num_target_layers"]
    one, two = _load(str(tmp_path / "d1"), n_target), _load(str(tmp_path / "d2"), n_target)
    assert two.selector is not None and hasattr(two.layers[0], "attention_conv")
    # the same forward and the same drafts (the chain with zero pair scores = the argmax)
    train, held = load_seqs(wd)
    batch = sample_anchors(train + held, 40, 4, torch.Generator().manual_seed(0))
    with torch.no_grad():
        h1, t1 = block_hidden(one, one_embed := _embed(target), one.cfg.mask_token_id, 4, batch)
        h2, _ = block_hidden(two, one_embed, two.cfg.mask_token_id, 4, batch)
    assert torch.equal(h1, h2)
    vocab = one.to_target(torch.arange(16))
    ids = anchor_ids(batch)
    argmax = _accepted(h1, t1, one_embed, vocab)
    assert torch.equal(_accepted(h2, t1, one_embed, vocab, two.selector, ids), argmax)
    # a zero-step warm start walks exactly as the parent; training moves the convolutions and the selector
    kw.update(keep_draft_vocab=True)
    parent = train_run(wd, target, steps=0, init_from=str(tmp_path / "d1"), **kw)["best_tau"]
    start = train_run(wd, target, steps=0, init_from=str(tmp_path / "d2"), **kw)["best_tau"]
    assert start == parent
    out = train_run(wd, target, steps=60, lr=1e-2, init_from=str(tmp_path / "d2"), **kw)
    assert out["loss_last"] < out["loss_first"], out
    export.run(wd, target, str(tmp_path / "d2t"), command="test", eval_anchors=40)
    trained = read_state_dict(str(tmp_path / "d2t"))
    assert trained["candidate_selector.predecessor_codebook"].abs().sum() > 0
    assert trained["layers.0.mlp_conv.kernel_projection.weight"].abs().sum() > 0
    loaded, dcfg, _ = load_exported(str(tmp_path / "d2t"), target)  # the server's loader and checks
    assert isinstance(loaded, DFlashDrafter) and dcfg.dflash2.selector_top_k == 4 and dcfg.dflash2.selector_rank == 8
    assert dcfg.dflash2.selector_walk == "chain" and loaded.selector.walk == "chain"
    with open(tmp_path / "d2t" / "config.json") as f:
        assert json.load(f)["dflash_config"]["conv_kernel_size"] == 2
    # its sampled walk (bench/drafter_arms.py): at T = 0 the greedy walk; at T = 1 the greedy path
    # (seeded requests) and the sampled path, each an expectation of at least one token a step
    dv = ids_from_d2t(loaded.d2t)
    walked = walk_counts(loaded, one_embed, dcfg.mask_token_id, 4, held, 24, vocab=dv, widths=[4])
    greedy = sum(t for t, _ in walked) / sum(b for _, b in walked)
    counts = sampled_walk_counts(
        loaded,
        one_embed,
        dcfg.mask_token_id,
        4,
        held,
        load_target(target, torch.float32),
        (0.0, 1.0),
        widths=(4,),
        max_answer=24,
        vocab=dv,
        autocast=False,
    )
    got = taus(counts)
    assert got["T0"]["argmax"]["4"] == pytest.approx(greedy, abs=1e-4)
    assert set(got["T1"]) == set(PATH_RULES) and all(1.0 <= got["T1"][r]["4"] <= 4.0 for r in PATH_RULES)


def _embed(target):
    from sglang_dflash.train.target_files import load_embedding

    return load_embedding(target).float()


def test_the_shipped_dflash2_drafter_loads_through_the_servers_checks():
    from sglang_dflash.embedded import derive
    from sglang_dflash.train.__main__ import DRAFTER_DIR

    path = os.path.join(os.path.dirname(DRAFTER_DIR), "smollm2-135m-instruct-dflash2")
    drafter, cfg, mask = load_exported(path, derive())
    assert cfg.dflash2.selector_walk == "chain" and drafter.selector.top_k == 8 and mask == 16
    assert cfg.draft_vocab_size == 16384 and hasattr(drafter.layers[1], "mlp_conv")
