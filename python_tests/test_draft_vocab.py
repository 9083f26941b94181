"""A reduced draft vocabulary (model/draft_vocab.py, EAGLE-3's d2t convention) and the labels that
train a drafter: text-document labels cut at the first off-chain token, features labelled by the target."""

import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from sglang_dflash.model.config import DrafterConfigError, check_against_target, load_drafter_config
from sglang_dflash.model.config import parse_drafter_config
from sglang_dflash.model.draft_vocab import coverage, d2t_from_ids, ids_from_d2t, most_frequent
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.loader import load_drafter
from sglang_dflash.pipeline.draft import propose, sample_drafts
from sglang_dflash.testing.tiny_config import tiny_cfg_dict
from sglang_dflash.testing.tiny_drafter import STEER_TOKEN, make_tiny_drafter
from sglang_dflash.testing.tiny_models import tiny_model_cache
from sglang_dflash.train.blocks import Seq, block_inputs

V, N, B = 50, 12, 6


def _drafters():
    """The same weights twice: scoring all V tokens, and scoring N of them through d2t."""
    torch.manual_seed(0)
    full = DFlashDrafter(parse_drafter_config(tiny_cfg_dict(block_size=B), 4)).eval()
    for p in full.parameters():
        torch.nn.init.normal_(p, std=0.3)
    cut = DFlashDrafter(parse_drafter_config(tiny_cfg_dict(block_size=B, draft_vocab_size=N), 4)).eval()
    cut.load_state_dict(full.state_dict(), strict=False)
    ids = torch.randperm(V)[:N].sort().values
    cut.d2t.copy_(d2t_from_ids(ids))
    return full, cut, ids


def _attend(layer, q, k, v):
    """Non-causal attention inside each block (no context): enough to exercise the head."""
    n = q.shape[0] // B
    q, k, v = (t.view(n, B, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2).reshape(n * B, -1, q.shape[-1])


def test_reduced_head_logits_equal_full_head_on_kept_tokens():
    full, cut, ids = _drafters()
    emb = torch.randn(V, 32)
    block = torch.full((3, B), 49)
    block[:, 0] = torch.tensor([3, 17, 30])
    pos = torch.arange(B).repeat(3, 1) + 5
    seen = {}
    head_full = lambda h: seen.setdefault("full", h @ emb.t())  # noqa: E731
    head_cut = lambda h: seen.setdefault("cut", h @ emb[ids].t())  # noqa: E731
    want = propose(full, _attend, lambda t: emb[t], head_full, block, pos).tokens
    got = propose(cut, _attend, lambda t: emb[t], head_cut, block, pos).tokens
    torch.testing.assert_close(seen["cut"], seen["full"][:, ids])
    assert torch.equal(got[:, 1:].reshape(-1), ids[seen["full"][:, ids].argmax(-1)])
    assert torch.isin(got[:, 1:], ids).all() and torch.equal(got[:, 0], block[:, 0])
    inside = torch.isin(want[:, 1:], ids)  # where the full argmax is a kept token, both agree
    assert torch.equal(got[:, 1:][inside], want[:, 1:][inside])
    # sampled DFlash 1 drafts map their candidates the same way
    logits = seen["cut"].view(3, B - 1, N)
    prop = sample_drafts(block.clone(), logits, torch.ones(3), B - 1, torch.zeros(3, B - 1, 32), cut.to_target)
    assert torch.isin(prop.cand_ids, ids).all() and torch.isin(prop.tokens[:, 1:], ids).all()


def test_d2t_helpers():
    ids = torch.tensor([2, 5, 9, 40])
    assert torch.equal(ids_from_d2t(d2t_from_ids(ids)), ids)
    counts = torch.tensor([0, 5, 5, 1, 9, 0])
    assert most_frequent(counts, 3).tolist() == [1, 2, 4] and coverage(counts, torch.tensor([1, 2, 4])) == 19 / 20


@pytest.fixture(scope="module")
def target():
    return str(tiny_model_cache("llama", "float32"))


def test_checkpoint_with_d2t_loads_and_bad_mappings_fail(target, tmp_path):
    path = make_tiny_drafter(str(tmp_path / "ok"), target, block_size=4, draft_vocab=40)
    cfg = load_drafter_config(path, 4)
    check_against_target(cfg, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size)
    m = load_drafter(path, cfg, torch.bfloat16, "cpu")
    saved = load_file(os.path.join(path, "model.safetensors"))
    assert m.d2t.dtype == torch.int64 and torch.equal(m.d2t, saved["d2t"])
    kept = ids_from_d2t(m.d2t)
    assert STEER_TOKEN in kept.tolist() and torch.equal(m.to_target(torch.arange(40)), kept)
    save_file({**saved, "t2d": torch.zeros(cfg.vocab_size, dtype=torch.bool)}, os.path.join(path, "model.safetensors"))
    load_drafter(path, cfg, torch.float32, "cpu")  # EAGLE-3's t2d beside d2t is accepted
    plain = make_tiny_drafter(str(tmp_path / "plain"), target, block_size=4)
    assert not hasattr(load_drafter(plain, load_drafter_config(plain, 4), torch.float32, "cpu"), "d2t")
    bad = {
        "range": saved["d2t"] + cfg.vocab_size,
        "twice": torch.zeros(40, dtype=torch.int64) - torch.arange(40),
        "float": saved["d2t"].float(),
        "shape": saved["d2t"][:30],
    }
    for name, d2t in bad.items():
        save_file({**saved, "d2t": d2t}, os.path.join(path, "model.safetensors"))
        with pytest.raises(DrafterConfigError, match="d2t"):
            load_drafter(path, cfg, torch.float32, "cpu")
    too_big = dataclasses.replace(cfg, draft_vocab_size=cfg.vocab_size + 1)
    with pytest.raises(DrafterConfigError, match="draft_vocab_size"):
        check_against_target(too_big, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size)


def test_text_labels_stop_at_the_first_off_chain_token():
    """Row j's label is the target's greedy token after p+j-1, kept only while the text between
    the anchor and it is the target's own greedy chain (what serving verifies after j-1 accepts)."""
    tokens = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
    labels = torch.tensor([-100, 3, 4, 9, 6, 7, 8, 11])  # the target would write 9 after 4, not 5
    seq = Seq("t", tokens, torch.zeros(8, 4), 1, labels)
    _, _, tgt = block_inputs(seq, torch.tensor([1, 4, 6]), 4, 0)
    assert tgt.tolist() == [[3, 4, 9], [6, 7, 8], [8, 11, -100]]
    answer = Seq("a", tokens, torch.zeros(8, 4), 1)  # the target's own answer: every next token counts
    _, _, tgt = block_inputs(answer, torch.tensor([1, 5]), 4, 0)
    assert tgt.tolist() == [[3, 4, 5], [7, 8, -100]]


def test_features_label_text_with_the_targets_argmax(target):
    from sglang_dflash.train.features import load_target, sequence_features

    model = load_target(target, torch.float32)
    tokens = torch.randint(3, 300, (20,), generator=torch.Generator().manual_seed(0))
    feats, labels, soft = sequence_features(model, tokens, [1, 2], label_from=8, topk=5, topk_from=6)
    with torch.no_grad():
        logits = model(input_ids=tokens[None]).logits[0].float()
    want = logits.argmax(-1)
    assert (labels[:8] == -100).all() and torch.equal(labels[8:], want[8:])
    assert feats.shape == (20, 2 * model.config.hidden_size)
    # the distillation targets: the target's own top 5 and their log-probabilities, answer part only
    ids, logp = soft
    ref_logp, ref_ids = logits.log_softmax(-1).topk(5, dim=-1)
    assert (ids[:6] == -1).all() and torch.isinf(logp[:6]).all()
    assert torch.equal(ids[6:].long(), ref_ids[6:]) and torch.allclose(logp[6:], ref_logp[6:], atol=1e-5)
    assert torch.equal(ids[8:, 0].long(), labels[8:])  # the hard label is the top-1
    _, nxt, none = sequence_features(model, tokens, [1, 2])
    assert torch.equal(nxt[:-1], tokens[1:]) and nxt[-1] == -100 and none is None
