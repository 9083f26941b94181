"""csrc/cpu/rms_norm_cpu.cpp: rms_norm equals SGLang's RMSNorm.forward_native bit for bit on bf16 rows
(with and without the residual add, bf16 and fp32 weights, 1 to 64 rows, 3-d input, empty), the
torch reference likewise, opcheck, bad input, and the serving hook routing only a DFLASH server's
bf16 decode-shaped norms to it, from the module SGLang runs."""

import pytest
import torch

from plugin_hooks import apply_plugin_hook
from sglang_dflash import kernels
from sglang_dflash.kernels.reference import rms_norm_ref
from sglang_dflash.cpu import cpu_linear

OPS = kernels.ops()


def sglang_norm(hidden=576, eps=1e-5, weight_dtype=torch.bfloat16, seed=0):
    from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

    install_cpu_shims()
    from sglang.srt.layers.layernorm import RMSNorm

    norm = RMSNorm(hidden, eps, weight_dtype=weight_dtype)
    g = torch.Generator().manual_seed(seed)
    norm.weight.data = (1 + 0.5 * torch.randn(hidden, generator=g)).to(weight_dtype)
    return norm


def rows(T, hidden=576, seed=1, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(T, hidden, generator=g)).bfloat16(), (
        scale * torch.randn(T, hidden, generator=g)
    ).bfloat16()


@pytest.mark.parametrize("T", [1, 2, 16, 64, 192])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("add", [True, False])
def test_equals_sglang_rms_norm(T, weight_dtype, add):
    norm = sglang_norm(weight_dtype=weight_dtype)
    for seed in range(4):  # several draws: a reduction-order difference shows as a changed bit somewhere
        x, r = rows(T, seed=seed, scale=10.0 ** (seed - 2))
        want = norm.forward_native(x.clone(), r.clone()) if add else (norm.forward_native(x.clone()), None)
        got = OPS.rms_norm(x, r if add else None, norm.weight, norm.variance_epsilon)
        ref = rms_norm_ref(x, r if add else None, norm.weight, norm.variance_epsilon)
        assert torch.equal(got[0], want[0]) and torch.equal(ref[0], want[0])
        if add:
            assert torch.equal(got[1], want[1]) and torch.equal(ref[1], want[1])
        else:
            assert got[1].numel() == 0 and ref[1].numel() == 0


@pytest.mark.parametrize("add", [True, False])
def test_vector_path_keeps_the_bits(add):
    """The AVX-512 loops (16 lanes, c10's rounding) on values past bf16's range once summed, infinities,
    a NaN row, rounding ties: SGLang's norm bit for bit, NaN where it has NaN, at one and two threads."""
    norm, before = sglang_norm(), torch.get_num_threads()
    x, r = rows(40, seed=5)
    x[3, :8] = torch.tensor([3.0e38, -3.0e38, float("inf"), 1.0, 1.00390625, -2.00781250, 0.0, -0.0])
    r[3, :8] = torch.tensor([3.0e38, -3.0e38, 1.0, 0.00390625, 0.001953125, -0.0078125, -0.0, -0.0])
    x[7, 5] = float("nan")
    want = norm.forward_native(x.clone(), r.clone()) if add else (norm.forward_native(x.clone()),)
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got = OPS.rms_norm(x, r if add else None, norm.weight, norm.variance_epsilon)
            for a, b in zip(got, want):
                assert torch.equal(a.isnan(), b.isnan())
                assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
    finally:
        torch.set_num_threads(before)


def test_shapes_empty_opcheck_and_inputs_untouched():
    norm = sglang_norm(hidden=64)
    x, r = rows(6, hidden=64)
    x3, r3 = x.view(2, 3, 64), r.view(2, 3, 64)
    before = (x3.clone(), r3.clone())
    out, res = OPS.rms_norm(x3, r3, norm.weight, 1e-6)
    assert out.shape == x3.shape and res.shape == x3.shape
    assert torch.equal(x3, before[0]) and torch.equal(r3, before[1])
    assert torch.equal(out.view(6, 64), rms_norm_ref(x, r, norm.weight, 1e-6)[0])
    e = OPS.rms_norm(x[:0], r[:0], norm.weight, 1e-6)
    assert e[0].shape == (0, 64) and e[1].shape == (0, 64)
    torch.library.opcheck(OPS.rms_norm, (x, r, norm.weight, 1e-6))
    torch.library.opcheck(OPS.rms_norm, (x, None, norm.weight, 1e-6))


def test_bad_input_names_the_field():
    x, r = rows(2)
    w = torch.ones(576)
    with pytest.raises(RuntimeError, match="x must be bfloat16"):
        OPS.rms_norm(x.float(), None, w, 1e-6)
    with pytest.raises(RuntimeError, match="weight must be"):
        OPS.rms_norm(x, None, w[:100], 1e-6)
    with pytest.raises(RuntimeError, match="residual must be"):
        OPS.rms_norm(x, r[:1], w, 1e-6)


def test_hook_routes_only_what_it_reproduces(monkeypatch):
    norm = sglang_norm()
    x, r = rows(3)
    original = lambda self, x, residual=None, post=None, quant=None: "torch"  # noqa: E731
    monkeypatch.setattr(cpu_linear, "wanted", lambda device, dtype: dtype == torch.bfloat16)
    assert not cpu_linear.enable("cpu", torch.float32)
    assert cpu_linear.rms_norm_forward(original, norm, x, r) == "torch"
    assert cpu_linear.enable("cpu", torch.bfloat16)
    try:
        got = cpu_linear.rms_norm_forward(original, norm, x, r)
        assert all(torch.equal(a, b) for a, b in zip(got, norm.forward_native(x, r)))  # original is the stand-in
        assert torch.equal(cpu_linear.rms_norm_forward(original, norm, x), rms_norm_ref(x, None, norm.weight, 1e-5)[0])
        big = rows(cpu_linear.NORM_MAX_TOKENS + 1)
        assert cpu_linear.rms_norm_forward(original, norm, *big) == "torch"  # prefill chunks: torch's ops
        assert cpu_linear.rms_norm_forward(original, norm, x, r, r) == "torch"  # post_residual_addition
        assert cpu_linear.rms_norm_forward(original, norm, x.float(), r.float()) == "torch"
        for attr, value in (("fp32_residual", True), ("cast_x_before_out_mul", True), ("variance_size_override", 64)):
            monkeypatch.setattr(norm, attr, value)
            assert cpu_linear.rms_norm_forward(original, norm, x, r) == "torch", attr
            monkeypatch.undo()
        monkeypatch.setattr(cpu_linear, "wanted", lambda device, dtype: dtype == torch.bfloat16)
        monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "norm=0")
        cpu_linear.enable("cpu", torch.bfloat16)
        assert cpu_linear.rms_norm_forward(original, norm, x, r) == "torch"
    finally:
        monkeypatch.delenv("SGLANG_DFLASH_CPU_OPS", raising=False)
        cpu_linear.enable("cpu", torch.float32)


def test_plugin_hook_reaches_the_norm_sglang_runs(monkeypatch):
    """The plugin's hook sits on the method SGLang's RMSNorm dispatches to on this CPU (without AMX:
    forward_native): rms_norm runs inside a real module call, with SGLang's own result."""
    norm = sglang_norm()
    x, r = rows(2)
    want = norm.forward_native(x, r)
    apply_plugin_hook(monkeypatch, cpu_linear.rms_norm_forward)
    monkeypatch.setattr(cpu_linear, "wanted", lambda device, dtype: True)
    cpu_linear.enable("cpu", torch.bfloat16)
    try:
        with torch.profiler.profile() as prof:
            got = norm(x, r)
    finally:
        cpu_linear.enable("cpu", torch.float32)
    assert any(e.name == "sglang_dflash::rms_norm" for e in prof.events())
    assert all(torch.equal(a, b) for a, b in zip(got, want))
