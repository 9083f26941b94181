"""csrc/cpu/packed_linear_cpu.cpp and cpu/packed_weights.py: a weight packed once for oneDNN gives
F.linear's result bit for bit (rows, bias, batch dims), an unpacked or resized weight falls back to
F.linear, the layer op's wide GEMMs take the packed copies with the same result, a weight updated in
place is packed again by the update hook (a stale copy would be wrong: the test shows it), the
modules packed, the auto rule, opcheck, bad input."""

import pytest
import torch
from test_llama_layer import CS, D, H, HKV, batch, layer

from sglang_dflash import kernels
from sglang_dflash.cpu import cpu_linear, packed_weights

OPS = kernels.ops()
# Where torch's oneDNN has bf16 (AVX512-BF16 or AMX hosts) a weight packs; elsewhere pack_linear says
# it did not, and every call is F.linear: what each test asserts either way.
PACKS = cpu_linear.native_bf16()


@pytest.fixture(autouse=True)
def empty_registry():
    OPS.unpack_linears()
    yield
    OPS.unpack_linears()
    packed_weights._state.update(model=None, packed=0)


def weights(seed=0, out=96, inp=64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(out, inp, generator=g) / 8).bfloat16(), torch.randn(out, generator=g).bfloat16()


@pytest.mark.parametrize("rows", [1, 9, 64, 200])
def test_packed_is_f_linear_bit_for_bit(rows):
    w, b = weights()
    assert OPS.pack_linear(w, 64) == PACKS
    x = torch.randn(rows, 64).bfloat16()
    assert torch.equal(OPS.packed_linear(x, w, None), torch.nn.functional.linear(x, w))
    assert torch.equal(OPS.packed_linear(x, w, b), torch.nn.functional.linear(x, w, b))
    x3 = torch.randn(3, rows, 64).bfloat16()
    assert torch.equal(OPS.packed_linear(x3, w, b), torch.nn.functional.linear(x3, w, b))
    for odd in (x[0], x[:0]):  # one row as a vector, no rows: torch's linear
        assert torch.equal(OPS.packed_linear(odd, w, b), torch.nn.functional.linear(odd, w, b))


def test_unpacked_and_other_weights_fall_back_and_opcheck():
    w, b = weights()
    other, _ = weights(seed=1)
    OPS.pack_linear(w, 64)
    x = torch.randn(16, 64).bfloat16()
    assert torch.equal(OPS.packed_linear(x, other, None), torch.nn.functional.linear(x, other))
    assert torch.equal(OPS.packed_linear(x.float(), w.float(), None), torch.nn.functional.linear(x.float(), w.float()))
    torch.library.opcheck(OPS.packed_linear, (x, w, b))
    assert OPS.unpack_linears() == int(PACKS)
    assert OPS.unpack_linears() == 0
    assert torch.equal(OPS.packed_linear(x, w, b), torch.nn.functional.linear(x, w, b))


def test_a_weight_updated_in_place_is_packed_again():
    w, _ = weights()
    model = torch.nn.Module()
    model.proj = type("RowParallelLinear", (torch.nn.Module,), {})()
    model.proj.weight = torch.nn.Parameter(w, requires_grad=False)
    assert packed_weights.pack(model) == int(PACKS)
    x = torch.randn(32, 64).bfloat16()

    def update(self):  # SGLang's loaders copy the new values into the same tensors
        model.proj.weight.data.mul_(-2)
        return "updated"

    stale = OPS.packed_linear(x, model.proj.weight, None)
    assert packed_weights.repack(update, None) == "updated"
    got, want = OPS.packed_linear(x, model.proj.weight, None), torch.nn.functional.linear(x, model.proj.weight)
    assert torch.equal(got, want)
    if PACKS:  # without the re-pack the old copy would have answered: the hook is what keeps it right
        assert not torch.equal(stale, want)


def test_the_layer_ops_wide_gemms_take_the_packed_copies():
    w = layer(bias=True)
    h, residual, positions, kc, vc, out_loc, slots, prefix = batch(4, 4)
    args = lambda kc, vc: (h, residual, positions, w["ln1"], w["qkv_w"], w["qkv_b"], w["o_w"], w["ln2"],  # noqa: E731
                           w["gate_up_w"], w["down_w"], CS, kc, vc, out_loc, slots, prefix, H, HKV, D, 1e-5,
                           D**-0.5, True, 0)  # fmt: skip
    kc2, vc2 = kc.clone(), vc.clone()
    want = OPS.llama_layer(*args(kc, vc))
    assert sum(OPS.pack_linear(w[n], 16) for n in ("qkv_w", "o_w", "gate_up_w", "down_w")) == 4 * PACKS
    got = OPS.llama_layer(*args(kc2, vc2))
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and torch.equal(kc, kc2) and torch.equal(vc, vc2)


def test_linear_weights_and_the_auto_rule(monkeypatch):
    model = torch.nn.Module()
    for name, kind, shape, dtype in (("qkv", "QKVParallelLinear", (8, 4), torch.bfloat16),
                                     ("head", "ParallelLMHead", (10, 4), torch.bfloat16),
                                     ("norm", "RMSNorm", (4,), torch.bfloat16),
                                     ("f32", "RowParallelLinear", (4, 4), torch.float32)):  # fmt: skip
        m = type(kind, (torch.nn.Module,), {})()
        m.weight = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
        setattr(model, name, m)
    model.tied = type("ParallelLMHead", (torch.nn.Module,), {})()
    model.tied.weight = model.qkv.weight  # a tied weight is packed once
    assert [tuple(w.shape) for w in packed_weights.linear_weights(model)] == [(8, 4), (10, 4)]
    monkeypatch.delenv("SGLANG_DFLASH_CPU_OPS", raising=False)  # auto: where the CPU has AMX tiles
    assert not packed_weights.wanted(False) and packed_weights.enable(model, False) == 0
    assert packed_weights.wanted(True) and packed_weights.enable(model, True) == 2 * PACKS
    for value, amx, want in (("auto", True, True), ("auto", False, False), ("1", False, True), ("0", True, False)):
        monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", f"packed={value}")
        assert packed_weights.wanted(amx) == want


def test_bad_input_names_the_field():
    with pytest.raises(RuntimeError, match="pack_linear: weight must be a contiguous"):
        OPS.pack_linear(torch.zeros(4, 4), 8)
    with pytest.raises(RuntimeError, match="pack_linear: weight must be a contiguous"):
        OPS.pack_linear(torch.zeros(4, 8).bfloat16().t(), 8)
