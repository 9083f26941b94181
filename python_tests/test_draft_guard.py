"""A drafter whose output is not finite never decides a token (pipeline/draft.guard and the
rejection rule's own check in target_sampling): rows with NaN / inf hidden states or q verify the
bare block with no q and are flagged as failed; a request whose context features overflow in half
precision is caught the same way; and a NaN q that reached verify anyway cannot pick a token
outside the target's support."""

import pytest
import torch

from sglang_dflash.model.config import parse_drafter_config
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.pipeline.attention import TorchBlockAttention
from sglang_dflash.pipeline.block import build_block
from sglang_dflash.pipeline.context_kv import DraftKVCache, write_context
from sglang_dflash.pipeline.draft import Proposal, guard, propose, sample_drafts
from sglang_dflash.pipeline.noise import WALK, gumbel
from sglang_dflash.pipeline.target_sampling import SamplingRows, target_tokens
from sglang_dflash.testing.tiny_config import tiny_cfg_dict

V, B, MASK = 50, 4, 49


def drafted(dtype=torch.float32, feature_scale=1.0, temperatures=None, sampled_slots=0):
    """Two requests drafted by a tiny drafter; request 1's context features scaled by feature_scale."""
    torch.manual_seed(0)
    cfg = parse_drafter_config(tiny_cfg_dict(block_size=B), 4)
    model = DFlashDrafter(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model = model.to(dtype)
    emb = torch.nn.Embedding(V, 32).to(dtype)
    cache = DraftKVCache(2, 64, 2, 8, dtype, "cpu")
    lens, slots = [5, 6], torch.randperm(64)
    ctx, blk = [slots[:5], slots[10:16]], [slots[30:34], slots[40:44]]
    for i, (s, n) in enumerate(zip(ctx, lens)):
        f = torch.randn(n, 64) * (feature_scale if i == 1 else 1.0)
        write_context(model, cache, f.to(dtype), torch.arange(n), s)
    ids, pos = build_block(torch.tensor([3, 4]), torch.tensor(lens), B, MASK)
    attend = TorchBlockAttention(cache.k, cache.v, [torch.cat(x) for x in zip(ctx, blk)], torch.cat(blk), 8**-0.5)
    noise = gumbel(2, B - 1, 32, None, None, WALK, "cpu") if temperatures is not None else None
    logits_fn = lambda h: (h @ emb.weight.t()).float()  # noqa: E731
    return ids, propose(model, attend, emb, logits_fn, ids, pos, temperatures, noise, None, sampled_slots)


def test_finite_drafts_pass_untouched():
    ids, prop = drafted()
    assert not bool(prop.failed.any()) and not torch.equal(prop.tokens, ids)


def test_half_precision_feature_overflow_verifies_the_bare_block():
    ids, prop = drafted(torch.float16, feature_scale=1e6)
    assert prop.failed.tolist() == [False, True]
    assert torch.equal(prop.tokens[1], ids[1])  # [anchor, MASK...]: the target's own tokens decide


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_q_rows_lose_their_q(value):
    temps = torch.tensor([1.0, 1.0])
    out = torch.zeros(2, B, dtype=torch.long)
    logits = torch.randn(2, B - 1, V)
    logits[1, 0, 7] = value
    noise = gumbel(2, B - 1, 32, None, None, WALK, "cpu")
    prop = guard(sample_drafts(out, logits, temps, B - 1, noise), out, torch.ones(2, dtype=torch.bool))
    assert prop.failed.tolist() == [False, True] and prop.q_rows.tolist() == [True, False]
    assert torch.equal(prop.tokens[1], out[1])


def test_a_nan_q_that_reaches_verify_cannot_pick_a_token_outside_the_support():
    """Defense in depth: even an unguarded proposal with a NaN q is verified by sample-and-match."""
    n, top_k = 2000, 2
    target = torch.randn(V) * 2
    logits = target.expand(n * B, V).clone()
    cand = torch.randint(0, V, (n, B - 1, 32))
    q = torch.full((n, B - 1, 32), float("nan"))
    prop = Proposal(torch.randint(0, V, (n, B)), cand, q, torch.ones(n, dtype=torch.bool))
    rows = SamplingRows(torch.ones(n), torch.ones(n), torch.full((n,), top_k), torch.zeros(n))
    tokens = target_tokens(logits, B, rows, prop)
    support = set(target.topk(top_k).indices.tolist())
    assert set(tokens.unique().tolist()) <= support
