"""Structured outputs under DFLASH, without a server: the verify rows' grammar masks (grammar_mask.py)
on SGLang's own xgrammar grammar objects and the tiny models' real tokenizer.

The losslessness test decodes a toy target (next-token logits depend on the previous token) two
ways: plain decoding (mask with the grammar, pick, advance the grammar), and speculative steps
(drafts, chain masks, target_tokens, accept_block, then advance the grammar along the committed
tokens the way SGLang's scheduler does). Greedy and seeded sampled outputs must be identical.
"""

import random

import pytest
import torch

from sglang_dflash.pipeline.accept import accept_block, stop_table
from sglang_dflash.pipeline.grammar_mask import allowed, apply_masks, chain_masks
from sglang_dflash.pipeline.target_sampling import SamplingRows, target_tokens
from sglang_dflash.testing.tiny_models import EOS_ID, VOCAB_SIZE, tiny_model_cache

V = VOCAB_SIZE
REGEX = r"(yes|no|maybe), [a-z]{2,12}( [a-z]{2,12}){0,6}\."
SCHEMA = '{"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "blue"]}}, "required": ["ok", "tag"], "additionalProperties": false}'  # noqa: E501


@pytest.fixture(scope="module")
def compiler():
    import xgrammar
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_cache("llama", "float32")))
    info = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=V, stop_token_ids=[EOS_ID])
    return xgrammar.GrammarCompiler(info), tok


def grammar(compiler, kind="regex"):
    """A fresh SGLang XGrammarGrammar, the object the scheduler hands to req.grammar."""
    import xgrammar
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar

    comp, _ = compiler
    ctx = comp.compile_regex(REGEX) if kind == "regex" else comp.compile_json_schema(SCHEMA, any_whitespace=False)
    return XGrammarGrammar(xgrammar.GrammarMatcher(ctx), V, ctx, None)


def mask_of(g):
    m = g.allocate_vocab_mask(V, 1, "cpu")
    g.fill_vocab_mask(m, 0)
    return m[0].clone()


def test_chain_rows_follow_the_drafts_and_the_matcher_is_rolled_back(compiler):
    _, tok = compiler
    g = grammar(compiler)
    for t in tok.encode("yes", add_special_tokens=False):
        g.accept_token(t)  # the anchor and what came before: already accepted by the scheduler
    before = mask_of(g)
    drafts = tok.encode(", ok go.", add_special_tokens=False)
    chain = torch.tensor([[0] + drafts])  # column 0: the anchor's slot, then the drafts
    masks = chain_masks([g, None], torch.cat([chain, chain]), V)
    W = chain.shape[1]
    assert torch.equal(mask_of(g), before)  # rolled back: the scheduler advances it itself
    ref = grammar(compiler)
    for t in tok.encode("yes", add_special_tokens=False):
        ref.accept_token(t)
    for j in range(W):
        if j:
            ref.accept_token(drafts[j - 1])
        if ref.is_terminated():
            break
        assert torch.equal(masks[j], mask_of(ref)), j
    assert bool((masks[W:] == -1).all())  # the unconstrained request's rows are all-allowed

    bad = torch.tensor([[0, drafts[0], tok.encode("Z", add_special_tokens=False)[0], drafts[1]]])
    masks = chain_masks([g], bad, V)
    assert not allowed(masks[1], int(bad[0, 2]))  # the forbidden draft is masked in the row before it
    assert bool((masks[2:] == -1).all())  # rows after it are never committed: left unmasked
    logits = torch.zeros(4, V)
    apply_masks([g], logits, masks)
    assert logits[1, int(bad[0, 2])] == float("-inf") and bool((logits[2:] == 0).all())


def toy_logits(prev: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """prev [N] previous tokens -> [N, V] the toy target's next-token logits."""
    return table[prev]


def plain_decode(g, table, anchor, n, sampling=None):
    out, prev = [], anchor
    for step in range(n):
        if g.is_terminated():
            break
        logits = toy_logits(torch.tensor([prev]), table).clone()
        apply_masks([g], logits, chain_masks([g], torch.tensor([[prev]]), V))
        rows = None if sampling is None else SamplingRows(*sampling, seeds=[5], offsets=[step])
        prev = int(target_tokens(logits, 1, rows)[0, 0])
        g.accept_token(prev)
        out.append(prev)
    return out


def spec_decode(g, table, anchor, n, want, rng, width=6, sampling=None):
    """Speculative steps at `width`; drafts: the reference's next tokens, sometimes corrupted."""
    out = []
    while len(out) < n and not g.is_terminated():
        k = len(out)
        drafts = [t if rng.random() < 0.7 else rng.randrange(V) for t in (want[k : k + width - 1] + [3] * width)]
        chain = torch.tensor([[anchor] + drafts[: width - 1]])
        logits = toy_logits(chain[0], table).clone()  # row j: the target after chain[j]
        apply_masks([g], logits, chain_masks([g], chain, V))
        rows = None if sampling is None else SamplingRows(*sampling, seeds=[5], offsets=[k])
        tokens = target_tokens(logits, width, rows)
        acc = accept_block(chain, tokens, torch.tensor([k]), torch.tensor([n - k]), stop_table([{EOS_ID}], "cpu"))
        committed = acc.out_tokens[0, : int(acc.commit_lens[0])].tolist()
        for t in committed:  # the scheduler's advance: stop once the grammar has ended
            if g.is_terminated():
                break
            g.accept_token(t)
            out.append(t)
        anchor = committed[-1]
    return out


@pytest.mark.parametrize("kind", ["regex", "json"])
@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_speculative_grammar_decoding_equals_plain(compiler, kind, temp):
    g0 = torch.Generator().manual_seed(3)
    sampling = None if temp == 0 else (torch.tensor([temp]), torch.tensor([0.95]), torch.tensor([-1]), torch.zeros(1))
    for trial in range(6):
        table = torch.randn(V, V, generator=g0) * 3
        want = plain_decode(grammar(compiler, kind), table, 1, 60, sampling)
        got = spec_decode(grammar(compiler, kind), table, 1, 60, want, random.Random(trial), sampling=sampling)
        assert got == want, (kind, temp, trial)
        if want and want[-1] == EOS_ID:  # the grammar finished: the text is a full match
            text = compiler[1].decode(want[:-1])
            if kind == "json":
                import json

                assert set(json.loads(text)) == {"ok", "tag"}
            else:
                import re

                assert re.fullmatch(REGEX, text), text
