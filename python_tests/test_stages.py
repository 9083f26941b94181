"""Unit tests of the plain-torch stages: config, block, draft (vs a dense reference), accept, verify."""

import sys
from types import SimpleNamespace

import pytest
import torch

from sglang_dflash.pipeline import attention
from sglang_dflash.pipeline.accept import accept_block, stop_table
from sglang_dflash.pipeline.attention import TorchBlockAttention
from sglang_dflash.pipeline.block import block_slots, build_block
from sglang_dflash.model.config import (
    DrafterConfigError,
    check_against_target,
    default_target_layer_ids,
    hf_hidden_state_index,
    parse_drafter_config,
)
from sglang_dflash.testing.reference import draft_block
from sglang_dflash.pipeline.context_kv import DraftKVCache
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.pipeline.context_kv import write_context
from sglang_dflash.testing.dense_drafter import dense_reference
from sglang_dflash.pipeline.target_sampling import SamplingRows, target_tokens
from sglang_dflash.testing.tiny_config import tiny_cfg_dict
from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

install_cpu_shims()  # before the srt import below pulls in sgl_kernel (SGLang's CPU engine: make's environment)
from sglang_dflash.srt.verify_backend import torch_native_verify  # noqa: E402


def cfg_dict(**kw):
    return tiny_cfg_dict(**kw)


def test_layer_id_convention():
    # z-lab: Qwen3-8B (36 layers) with 5 draft layers -> [1, 9, 17, 25, 33]
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(30, 1) == [15]
    assert hf_hidden_state_index(1) == 2  # the output of layer 1 is HF hidden_states[2]


@pytest.mark.parametrize(
    "change, field",
    [
        ({"block_size": 1}, "block_size"),
        ({"dflash_config": {"target_layer_ids": [0]}}, "mask token"),
        ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [0, 9]}}, "target_layer_ids"),
        ({"hidden_size": "x"}, "hidden_size"),
    ],
)
def test_bad_config_names_field(change, field):
    with pytest.raises(DrafterConfigError, match=field):
        parse_drafter_config(cfg_dict(**change), target_num_layers=4)


def test_config_against_target():
    cfg = parse_drafter_config(cfg_dict(), 4)
    check_against_target(cfg, hidden_size=32, vocab_size=50)
    with pytest.raises(DrafterConfigError, match="hidden_size"):
        check_against_target(cfg, hidden_size=64, vocab_size=50)
    with pytest.raises(DrafterConfigError, match="vocab_size"):
        check_against_target(cfg, hidden_size=32, vocab_size=51)
    old = parse_drafter_config(cfg_dict(dflash_config={"target_layer_ids": [1]}, mask_token="<m>"), 4)
    assert old.mask_token == "<m>" and old.mask_token_id is None


def test_block_and_slots():
    ids, pos = build_block(torch.tensor([7, 8]), torch.tensor([3, 5]), 4, 99)
    assert ids.tolist() == [[7, 99, 99, 99], [8, 99, 99, 99]]
    assert pos.tolist() == [[3, 4, 5, 6], [5, 6, 7, 8]]
    r2t = torch.arange(40).view(2, 20).flip(0)
    assert block_slots(r2t, torch.tensor([1, 0]), torch.tensor([3, 5]), 2).tolist() == [[3, 4], [25, 26]]


def test_accept_longest_prefix_plus_bonus():
    draft = torch.tensor([[5, 1, 2, 3], [5, 9, 2, 3], [5, 1, 2, 3]])
    target = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 7, 4]])
    big, none = torch.full((3,), 100), stop_table([set(), set(), set()], "cpu")
    res = accept_block(draft, target, torch.zeros(3, dtype=torch.long), big, none)
    assert res.accept_lens.tolist() == [3, 0, 2] and res.commit_lens.tolist() == [4, 1, 3]
    assert res.bonus.tolist() == [4, 1, 7] and res.new_seq_lens.tolist() == [4, 1, 3]
    assert stop_table([{3, 1}, set()], "cpu").tolist() == [[1, 3], [-1, -1]]
    assert res.committed_rows().tolist() == [0, 1, 2, 3, 4, 8, 9, 10]


def test_verify_greedy_and_filters():
    logits = torch.randn(2 * 3, 10)
    assert torch.equal(target_tokens(logits, 3), logits.argmax(-1).view(2, 3))
    # top_k=1 rows stay greedy even when sampling is requested
    t = target_tokens(
        logits,
        3,
        SamplingRows(
            torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0]), torch.tensor([1, 1]), torch.tensor([0.0, 0.0])
        ),
    )
    assert torch.equal(t, logits.argmax(-1).view(2, 3))
    # top_p tiny -> the argmax only
    t = target_tokens(
        logits,
        3,
        SamplingRows(
            torch.tensor([2.0, 2.0]), torch.tensor([1e-6, 1e-6]), torch.tensor([-1, -1]), torch.tensor([0.0, 0.0])
        ),
    )
    assert torch.equal(t, logits.argmax(-1).view(2, 3))


def test_paged_draft_matches_dense_reference():
    torch.manual_seed(0)
    cfg = parse_drafter_config(cfg_dict(), 4)
    model = DFlashDrafter(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    emb = torch.nn.Embedding(50, 32)
    cache = DraftKVCache(2, 64, 2, 8, torch.float32, "cpu")
    lens, B = [5, 9], 4
    slots = torch.randperm(64)
    feats = [torch.randn(n, 64) for n in lens]
    ctx_slots = [slots[:5], slots[10:19]]
    blk_slots = [slots[30:34], slots[40:44]]
    for f, s in zip(feats, ctx_slots):
        write_context(model, cache, f, torch.arange(len(s)), s)
    ids, pos = build_block(torch.tensor([3, 4]), torch.tensor(lens), B, 49)
    attend = TorchBlockAttention(
        cache.k, cache.v, [torch.cat(x) for x in zip(ctx_slots, blk_slots)], torch.cat(blk_slots), 8**-0.5
    )
    out = draft_block(model, attend, emb, lambda h: h @ emb.weight.t(), ids, pos)
    for i, n in enumerate(lens):
        ref = dense_reference(model, feats[i], torch.arange(n), emb(ids[i]), pos[i])
        ref_tok = (ref[1:] @ emb.weight.t()).argmax(-1)
        assert out[i, 0] == ids[i, 0] and torch.equal(out[i, 1:], ref_tok)


def test_fused_context_write_equals_layer_math():
    """projection.write_context (fused op) stores what each layer's own k_norm/RoPE/v_proj give."""
    torch.manual_seed(1)
    cfg = parse_drafter_config(cfg_dict(), 4)
    model = DFlashDrafter(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, mean=1.0 if p.dim() == 1 else 0.0, std=0.2)
    cache = DraftKVCache(2, 40, 2, 8, torch.float32, "cpu")
    feats, pos, slots = torch.randn(6, 64), torch.tensor([0, 1, 2, 7, 8, 300]), torch.randperm(40)[:6]
    write_context(model, cache, feats, pos, slots)
    k, v = model.context_kv(feats, pos)
    torch.testing.assert_close(cache.k[:, slots], k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.v[:, slots], v, rtol=1e-5, atol=1e-5)


def test_request_check_names_each_unsupported_field():
    from types import SimpleNamespace

    from sglang_dflash.srt.request_check import unsupported_reason

    plain = SimpleNamespace(
        frequency_penalty=0.0,
        presence_penalty=0.0,
        repetition_penalty=1.0,
        min_new_tokens=0,
        logit_bias=None,
        json_schema=None,
        regex=None,
        ebnf=None,
        structural_tag=None,
    )
    assert unsupported_reason(plain) is None
    msg = unsupported_reason(SimpleNamespace(**{**vars(plain), "watermark": {"k": 1}}))
    assert "watermark" in msg and "sglang_dflash" in msg
    for field, value in [("regex", "a+"), ("ebnf", "root ::= x"), ("json_schema", "{}"), ("structural_tag", "{}")]:
        assert unsupported_reason(SimpleNamespace(**{**vars(plain), field: value})) is None  # grammar_mask.py
    assert "custom_logit_processor" in unsupported_reason(plain, custom_logit_processor="x")
    served = SimpleNamespace(
        **{
            **vars(plain),
            "frequency_penalty": 0.3,
            "presence_penalty": 0.2,
            "repetition_penalty": 1.1,
            "min_new_tokens": 2,
            "logit_bias": {"1": 2.0},
        }
    )
    assert unsupported_reason(served) is None  # penalties are served exactly (penalties.py)
    from sglang_dflash.srt.request_check import max_width, width_cap_error

    for cap, ok in [
        (None, True),
        (1, True),
        (16, True),
        (0, False),
        (-1, False),
        (True, False),
        ("2", False),
        (2.0, False),
    ]:
        sp = SimpleNamespace(custom_params={"dflash_max_width": cap} if cap is not None else {"other": 1})
        err = width_cap_error(sp)
        assert (err is None) == ok and (ok or "dflash_max_width" in err), (cap, err)
    assert max_width(SimpleNamespace(custom_params=None)) is None and max_width(plain) is None


def test_launcher_fills_cpu_defaults_but_never_overrides():
    from sglang_dflash.launch import with_defaults

    args = with_defaults(["--model-path", "m", "--max-total-tokens=999"], gpu=False)
    assert args.count("--max-total-tokens=999") == 1 and "16384" not in args
    assert args[args.index("--speculative-algorithm") + 1] == "DFLASH"
    assert args[args.index("--attention-backend") + 1] == "torch_native" and "--disable-cuda-graph" in args
    assert "--device" not in with_defaults(["--model-path", "m"], gpu=True)


def test_cpu_binding_for_tp_ranks():
    from sglang_dflash.launch import cpu_binding

    assert cpu_binding(2, 2) == "0|1" and cpu_binding(2, 4) == "0-1|2-3" and cpu_binding(1, 2) == "0-1"


def test_stage_clock_reports_each_stage_in_order():
    from sglang_dflash.srt.metrics import STAGES, StageClock

    clock = StageClock("cpu")
    for stage in STAGES:
        sum(range(20000))
        clock.mark(stage)
    secs = clock.seconds()
    assert list(secs) == list(STAGES) and all(v > 0 for v in secs.values())


# --- batched CPU attention (pipeline/attention.py) vs the per-request loop it replaced ---------------


def looped(q, kc, vc, kv_slots, B, window=None, causal=False):
    """The old per-request loops: verify_attention (causal) and TorchBlockAttention (window or none)."""
    out, t = torch.empty_like(q), lambda x: x.transpose(0, 1).unsqueeze(0)
    for i, slots in enumerate(kv_slots):
        prefix, r = slots.numel() - B, slice(i * B, (i + 1) * B)
        start = 0 if window is None else max(0, prefix - window + 1)
        j, p = start + torch.arange(prefix + B - start)[None, :], prefix + torch.arange(B)[:, None]
        mask = j <= p if causal else None if window is None else (j >= prefix) | (j > p - window)
        k, v = t(kc[slots[start:]]), t(vc[slots[start:]])
        o = torch.nn.functional.scaled_dot_product_attention(t(q[r]), k, v, mask, scale=0.125, enable_gqa=True)
        out[r] = o.squeeze(0).transpose(0, 1)
    return out


def paged_pool(prefix, B, layers=1):
    """Shuffled paged KV [layers, S, 3, 64]; req_to_token rows past a request's length hold other live slots."""
    g, lens = torch.Generator().manual_seed(0), [p + B for p in prefix]
    S = sum(lens) + 8
    k, v = torch.randn(layers, S, 3, 64, generator=g), torch.randn(layers, S, 3, 64, generator=g)
    req_to_token = torch.randint(0, S, (6 + len(prefix), max(lens) + 5), generator=g, dtype=torch.int32)
    rpi = torch.randperm(req_to_token.shape[0], generator=g)[: len(prefix)]
    kv_slots = list(torch.randperm(S, generator=g)[: sum(lens)].split(lens))
    for r, s in zip(rpi.tolist(), kv_slots):
        req_to_token[r, : s.numel()] = s
    return k, v, req_to_token, rpi, kv_slots


RAGGED = [0, 5, 731, 40, 300, 290]  # an empty prefix, a long one; 3 length groups, rows out of order
WINDOWS = [None, 30, 2000, 3]  # full; smaller than the long prefix; larger than every prefix; smaller than B


@pytest.mark.parametrize("B", [1, 4, 16])
@pytest.mark.parametrize("path", ["hook", "one group"])
def test_batched_verify_matches_loop(B, path, monkeypatch):
    """GQA 9/3/64. hook: SGLang's torch_native verify (length groups); one group: no host lengths (CUDA)."""
    # Its KV write needs SGLang's pool (sgl_kernel); this test writes nothing, so a stand-in module will do.
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.memory_pool", SimpleNamespace(KVWriteLoc=None))
    if path == "one group":
        monkeypatch.setattr(attention, "host_lengths", lambda prefix: None)
    (k, v, r2t, rpi, kv_slots), q = paged_pool(RAGGED, B), torch.randn(len(RAGGED) * B, 9, 64)
    kv = SimpleNamespace(get_key_buffer=lambda i: k[i], get_value_buffer=lambda i: v[i])
    backend = SimpleNamespace(token_to_kv_pool=kv, req_to_token_pool=SimpleNamespace(req_to_token=r2t))
    fb = SimpleNamespace(batch_size=len(RAGGED), seq_lens=torch.tensor(RAGGED), seq_lens_cpu=None, req_pool_indices=rpi)
    layer = SimpleNamespace(tp_q_head_num=9, qk_head_dim=64, v_head_dim=64, layer_id=0, scaling=0.125)
    got = torch_native_verify(backend, q.reshape(q.shape[0], -1), None, None, layer, fb, save_kv_cache=False)
    torch.testing.assert_close(got.view_as(q), looped(q, k[0], v[0], kv_slots, B, causal=True), rtol=0, atol=1e-5)


@pytest.mark.parametrize("B", [1, 16])
@pytest.mark.parametrize("form", ["slot lists", "slot table", "one group"])
def test_batched_block_attention_matches_loop(B, form, monkeypatch):
    """Drafting, GQA 9/3/64, a window per layer: each constructor form (and the CUDA one-group plan) == the loop."""
    if form == "one group":  # no host lengths: one call, rows as given, full table width
        monkeypatch.setattr(attention, "host_lengths", lambda prefix: None)
    k, v, r2t, rpi, kv_slots = paged_pool(RAGGED, B, layers=len(WINDOWS))
    block_slots, n = torch.cat([s[-B:] for s in kv_slots]), len(RAGGED) * B
    prefix = None if form == "slot lists" else torch.tensor(RAGGED)
    table = kv_slots if prefix is None else attention.slot_table(r2t, rpi, r2t.shape[1])
    attend = TorchBlockAttention(k.clone(), v.clone(), table, block_slots, 0.125, WINDOWS, prefix=prefix)
    for layer in range(len(WINDOWS)):
        q, kb, vb = torch.randn(n, 9, 64), torch.randn(n, 3, 64), torch.randn(n, 3, 64)
        k[layer, block_slots], v[layer, block_slots] = kb, vb  # what the class stores before attending
        want = looped(q, k[layer], v[layer], kv_slots, B, WINDOWS[layer])
        torch.testing.assert_close(attend(layer, q, kb, vb), want, rtol=0, atol=1e-5)


def test_batch_masks_and_groups():
    """batch_mask holds window_mask's rule row for row; length groups bound the padding."""
    B, W, prefix, start = 4, 3, [0, 2, 9], [0, 0, 7]  # start: the first key inside any query's window
    got = attention.batch_mask(torch.tensor(prefix), B, 12, torch.tensor(start), W)  # [bs, 1, B, 12]
    for i, (p, s) in enumerate(zip(prefix, start)):
        assert torch.equal(got[i, 0, :, : p + B - s], attention.window_mask(p, B, s, W, "cpu"))
        assert not got[i, 0, :, p + B - s :].any()  # padding
    # 800, 700 pad to 816 by at most 20%; 500 would pad by 316 keys; 116, 100 pad to 130 by < 64 keys
    assert attention.length_groups([816, 800, 700, 500, 130, 116, 100]) == [(0, 3, 816), (3, 4, 500), (4, 7, 130)]
