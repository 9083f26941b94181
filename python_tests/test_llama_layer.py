"""csrc/cpu/llama_layer_cpu.cpp: one Llama decoder layer in one call equals the same ops called one by
one in the order cpu/llama_stack.py called them (norm, QKV GEMM, rotary, KV write, chain attention,
output GEMM, norm, gate/up GEMM, torch's silu and mul, down GEMM) bit for bit, outputs and the KV
pool alike, at layer 0 (no residual) and after it, one request and several, 1 to 16 rows each, with
the GEMMs on bf16_linear or (past gemm_rows, as cpu/cpu_linear.py routes them) torch's linear; the
torch reference (kernels/reference.py) within bf16 rounding; opcheck; bad input."""

import pytest
import torch

from sglang_dflash import kernels
from sglang_dflash.kernels.reference import llama_layer_ref, rope_cos_sin_cache

OPS = kernels.ops()
HID, H, HKV, D, INTER, S = 128, 4, 2, 32, 256, 2048


def layer(seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    w = lambda *s: (torch.randn(*s, generator=g) / s[-1] ** 0.5).bfloat16()  # noqa: E731
    return dict(
        ln1=(1 + 0.3 * torch.randn(HID, generator=g)).bfloat16(),
        qkv_w=w((H + 2 * HKV) * D, HID),
        qkv_b=w((H + 2 * HKV) * D) if bias else None,
        o_w=w(HID, H * D),
        ln2=(1 + 0.3 * torch.randn(HID, generator=g)).bfloat16(),
        gate_up_w=w(2 * INTER, HID),
        down_w=w(HID, INTER),
    )


def batch(bs, rows, seed=1, first=False):
    """bs requests of `rows` chain rows each after random committed prefixes."""
    g = torch.Generator().manual_seed(seed)
    T = bs * rows
    prefix = torch.randint(3, 40, (bs,), generator=g)
    width = int(prefix.max()) + rows
    slots = (1 + torch.randperm(S - 1, generator=g)[: bs * width]).view(bs, width)  # slot 0: padding
    positions = torch.cat([torch.arange(p, p + rows) for p in prefix.tolist()])
    out_loc = torch.cat([slots[i, p : p + rows] for i, p in enumerate(prefix.tolist())])
    h = (2 * torch.randn(T, HID, generator=g)).bfloat16()
    residual = None if first else (2 * torch.randn(T, HID, generator=g)).bfloat16()
    kc = torch.randn(S, HKV, D, generator=g).bfloat16()
    vc = torch.randn(S, HKV, D, generator=g).bfloat16()
    return h, residual, positions, kc, vc, out_loc, slots, prefix


CS = rope_cos_sin_cache(256, D, 10000.0)


def op_by_op(h, residual, positions, w, kc, vc, out_loc, slots, prefix, eps, scale, gemm_rows):
    """The sequence cpu/llama_stack.py runs without the layer op, one torch op call at a time."""
    linear = OPS.bf16_linear if h.shape[0] <= gemm_rows else torch.nn.functional.linear
    if residual is None:
        x, res_mid = OPS.rms_norm(h, None, w["ln1"], eps)[0], h
    else:
        x, res_mid = OPS.rms_norm(h, residual, w["ln1"], eps)
    q, k, v = linear(x, w["qkv_w"], w["qkv_b"]).split([H * D, HKV * D, HKV * D], dim=-1)
    q, k = OPS.rope_qk(positions, q, k, CS, D, True)
    k, v = k.view(-1, HKV, D), v.view(-1, HKV, D)  # RadixAttention.forward's views
    kc[out_loc] = k  # SGLang's set_kv_buffer
    vc[out_loc] = v
    attn = OPS.chain_attention(q.view(-1, H, D), kc, vc, slots, prefix, scale, True).reshape(h.shape[0], H * D)
    x, res_out = OPS.rms_norm(linear(attn, w["o_w"], None), res_mid, w["ln2"], eps)
    gu = linear(x, w["gate_up_w"], None)
    d = gu.shape[-1] // 2
    act = torch.nn.functional.silu(gu[..., :d]) * gu[..., d:]  # SiluAndMul.forward_native
    return linear(act, w["down_w"], None), res_mid, res_out


def call(fn, h, residual, positions, w, kc, vc, out_loc, slots, prefix, eps=1e-5, scale=D**-0.5, gemm_rows=2**62):
    args = (h, residual, positions, w["ln1"], w["qkv_w"], w["qkv_b"], w["o_w"], w["ln2"], w["gate_up_w"])
    return fn(*args, w["down_w"], CS, kc, vc, out_loc, slots, prefix, H, HKV, D, eps, scale, True, gemm_rows)


@pytest.mark.parametrize("bs,rows", [(1, 1), (1, 4), (3, 2), (4, 4), (32, 4), (1, 16), (2, 8), (4, 16)])
@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("gemm_rows", [2**62, 3])
def test_one_call_equals_the_ops_one_by_one(bs, rows, first, bias, gemm_rows):
    w = layer(bias=bias)
    h, residual, positions, kc, vc, out_loc, slots, prefix = batch(bs, rows, seed=bs * 10 + rows, first=first)
    kc2, vc2 = kc.clone(), vc.clone()
    got = call(OPS.llama_layer, h, residual, positions, w, kc, vc, out_loc, slots, prefix, gemm_rows=gemm_rows)
    want = op_by_op(h, residual, positions, w, kc2, vc2, out_loc, slots, prefix, 1e-5, D**-0.5, gemm_rows)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)  # the same K/V written at the same slots
    if first:
        assert torch.equal(got[1], h)  # layer 0: the embeddings are the residual stream


@pytest.mark.parametrize("bs,narrow", [(1, 1), (1, 4), (3, 5)])
def test_a_rows_output_does_not_depend_on_the_width_verified(bs, narrow):
    """A verify of 16 rows a request gives its first `narrow` rows the bits a verify of `narrow` rows
    gives them (our GEMM and chain attention compute each row on its own), so the width controller
    choosing a wider verify never changes what a narrower one would have committed."""
    w = layer()
    wide = 16
    h, residual, positions, kc, vc, out_loc, slots, prefix = batch(bs, wide, seed=7)
    keep = torch.cat([torch.arange(i * wide, i * wide + narrow) for i in range(bs)])
    kn, vn = kc.clone(), vc.clone()
    got = call(OPS.llama_layer, h, residual, positions, w, kc, vc, out_loc, slots, prefix)
    args = (h[keep], residual[keep], positions[keep], w, kn, vn, out_loc[keep], slots, prefix)
    want = call(OPS.llama_layer, *args)
    for a, b in zip(got, want):
        assert torch.equal(a[keep], b)


def test_reference_within_bf16_rounding_and_opcheck():
    w = layer()
    h, residual, positions, kc, vc, out_loc, slots, prefix = batch(2, 3)
    kr, vr = kc.clone(), vc.clone()
    got = call(OPS.llama_layer, h, residual, positions, w, kc, vc, out_loc, slots, prefix)
    ref = call(llama_layer_ref, h, residual, positions, w, kr, vr, out_loc, slots, prefix)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.float(), b.float(), rtol=0.05, atol=0.05)
    torch.testing.assert_close(kc.float(), kr.float(), rtol=0.02, atol=0.02)
    args = (h, residual, positions, w["ln1"], w["qkv_w"], w["qkv_b"], w["o_w"], w["ln2"], w["gate_up_w"])
    for gemm_rows in (2**62, 0):
        torch.library.opcheck(OPS.llama_layer, args + (w["down_w"], CS, kc, vc, out_loc, slots, prefix, H, HKV, D,
                                                      1e-5, D**-0.5, True, gemm_rows))  # fmt: skip


def test_bad_input_names_the_argument():
    w = layer()
    h, residual, positions, kc, vc, out_loc, slots, prefix = batch(1, 2)
    with pytest.raises(RuntimeError, match="llama_layer: k_cache, v_cache must be"):
        call(OPS.llama_layer, h, residual, positions, w, kc.float(), vc.float(), out_loc, slots, prefix)
    with pytest.raises(RuntimeError, match="llama_layer: h must be"):
        call(OPS.llama_layer, h.float(), residual, positions, w, kc, vc, out_loc, slots, prefix)
    with pytest.raises(RuntimeError, match="llama_layer: out_loc .* outside the KV pool"):
        call(OPS.llama_layer, h, residual, positions, w, kc, vc, out_loc + kc.shape[0], slots, prefix)
