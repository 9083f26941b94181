"""csrc/cpu/bf16_linear_cpu.cpp against its torch reference: every code path (decode rows streamed, verify
rows tiled, row and column tails, K not a multiple of 8, bias, leading dims), opcheck, bad input, and
the serving hooks (cpu/cpu_linear.py) routing only a DFLASH server's bf16 CPU GEMMs to it."""

import types

import pytest
import torch

from sglang_dflash import kernels
from sglang_dflash.kernels.reference import bf16_linear_ref
from sglang_dflash.cpu import cpu_linear

OPS = kernels.ops()


def case(M, K, N, bias, seed=0, lead=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, M, K, generator=g).bfloat16()
    w = (torch.randn(N, K, generator=g) / K**0.5).bfloat16()
    b = torch.randn(N, generator=g).bfloat16() if bias else None
    return x, w, b


def within_one_ulp(y, x, w, b):
    """Each output within one bf16 step of the exact (float64) value: what an fp32 sum in any order
    then one rounding to bf16 can give; a wrong row, column or tail is off by far more."""
    exact = x.double() @ w.double().T + (b.double() if b is not None else 0)
    ulp = torch.finfo(torch.bfloat16).eps * exact.abs().clamp_min(1e-3)
    assert ((y.double() - exact).abs() <= ulp + 1e-6).all()


@pytest.mark.parametrize("M", [1, 2, 3, 4, 7, 16, 48])
@pytest.mark.parametrize("K,N", [(64, 64), (576, 130), (24, 9), (20, 5), (8, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_reference(M, K, N, bias):
    x, w, b = case(M, K, N, bias, seed=M * 1000 + K + N)
    y = OPS.bf16_linear(x, w, b)
    ref = bf16_linear_ref(x, w, b)
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    within_one_ulp(y, x, w, b)
    assert (y == ref).float().mean() > 0.95  # the same fp32 sum, only the order differs


def test_leading_dims_and_empty():
    x, w, b = case(5, 64, 12, True, lead=(2,))
    y = OPS.bf16_linear(x, w, b)
    assert y.shape == (2, 5, 12)
    within_one_ulp(y, x, w, b)
    assert OPS.bf16_linear(x[:, :0], w, b).shape == (2, 0, 12)


def test_opcheck():
    torch.library.opcheck(OPS.bf16_linear, case(3, 64, 8, True))
    torch.library.opcheck(OPS.bf16_linear, case(1, 64, 8, False))


def test_bad_input_names_the_field():
    x, w, _ = case(2, 64, 8, False)
    with pytest.raises(RuntimeError, match="bfloat16"):
        OPS.bf16_linear(x.float(), w, None)
    with pytest.raises(RuntimeError, match=r"weight \[N, K\]"):
        OPS.bf16_linear(x, w[:, :32], None)


def test_hooks_route_only_when_enabled(monkeypatch):
    calls = []

    def original(self, layer, x, bias=None):
        calls.append("torch")
        return torch.nn.functional.linear(x, layer.weight, bias)

    x, w, b = case(4, 64, 8, True)
    layer = types.SimpleNamespace(weight=w)
    monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "linear=0")
    assert not cpu_linear.enable("cpu", torch.bfloat16)
    cpu_linear.linear_apply(original, None, layer, x, b)
    assert calls == ["torch"]
    monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "linear=1")
    assert not cpu_linear.enable("cpu", torch.float32) and not cpu_linear.enable("cuda", torch.bfloat16)
    assert cpu_linear.enable("cpu", torch.bfloat16)
    try:
        y = cpu_linear.linear_apply(original, None, layer, x, b)
        assert calls == ["torch"]  # not called again
        within_one_ulp(y, x, w, b)
        fp32_layer = types.SimpleNamespace(weight=w.float())
        cpu_linear.linear_apply(original, None, fp32_layer, x.float(), None)  # an fp32 layer: torch's
        assert calls == ["torch", "torch"]
        # auto on a host with oneDNN's native bf16: ours only up to NATIVE_BF16_MAX_ROWS rows
        monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "linear=auto")
        monkeypatch.setattr(cpu_linear, "native_bf16", lambda: True)
        monkeypatch.setattr(cpu_linear, "dot_bf16", lambda: True)  # AVX512-BF16: ours up to 64 rows
        monkeypatch.setattr(cpu_linear, "amx_bf16", lambda: False)
        assert cpu_linear.enable("cpu", torch.bfloat16)
        assert cpu_linear._state["max_rows"] == cpu_linear.DOT_BF16_MAX_ROWS
        monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "linear=auto,packed=1")  # packed: oneDNN past 16 rows
        assert cpu_linear.enable("cpu", torch.bfloat16)
        assert cpu_linear._state["max_rows"] == cpu_linear.gemm_rows() == cpu_linear.DOT_PACKED_MAX_ROWS
        monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "linear=auto")
        monkeypatch.setattr(cpu_linear, "amx_bf16", lambda: True)  # and AMX tiles: oneDNN's sooner,
        monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "linear=auto")  # sooner still on weights packed for
        assert cpu_linear.enable("cpu", torch.bfloat16)  # it (auto: on AMX hosts)
        assert cpu_linear._state["max_rows"] == cpu_linear.AMX_PACKED_MAX_ROWS
        monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "linear=auto,packed=1")
        assert cpu_linear.enable("cpu", torch.bfloat16)
        assert cpu_linear._state["max_rows"] == cpu_linear.gemm_rows() == cpu_linear.AMX_PACKED_MAX_ROWS
        monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "linear=auto,packed=0")
        assert cpu_linear.enable("cpu", torch.bfloat16)
        assert cpu_linear._state["max_rows"] == cpu_linear.gemm_rows() == cpu_linear.AMX_MAX_ROWS
        a = cpu_linear.AMX_MAX_ROWS
        wide = case(a + 1, 64, 8, True)[0]
        assert cpu_linear.plain_layer(layer, wide, b) and not cpu_linear.layer_fast(layer, wide, b)
        assert torch.equal(cpu_linear.linear(wide, w, b), torch.nn.functional.linear(wide, w, b))
        assert torch.equal(cpu_linear.linear(x[:a], w, b), torch.ops.sglang_dflash.bf16_linear(x[:a], w, b))
        monkeypatch.setattr(cpu_linear, "dot_bf16", lambda: False)
        assert cpu_linear.enable("cpu", torch.bfloat16)
        n = cpu_linear.NATIVE_BF16_MAX_ROWS
        within_one_ulp(cpu_linear.linear_apply(original, None, layer, x[:n], b), x[:n], w, b)
        assert calls == ["torch", "torch"]
        cpu_linear.linear_apply(original, None, layer, case(n + 1, 64, 8, True)[0], b)
        assert calls == ["torch", "torch", "torch"]  # a wider verify: oneDNN's
        monkeypatch.setattr(cpu_linear, "native_bf16", lambda: False)  # no native bf16: every width ours
        assert cpu_linear.enable("cpu", torch.bfloat16)
        cpu_linear.linear_apply(original, None, layer, case(n + 1, 64, 8, True)[0], b)
        assert calls == ["torch", "torch", "torch"]
    finally:
        monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "linear=0")
        cpu_linear.enable("cpu", torch.bfloat16)


@pytest.mark.parametrize("M", [1, 2, 5, 16])
def test_threads_split_the_columns_bit_identically(M):
    """The extension is built with OpenMP (setup.py), so at::parallel_for splits W's rows over torch's
    threads (its inlined loop calls OpenMP's runtime: without -fopenmp it would run on one thread
    whatever OMP_NUM_THREADS says); each output column is still one thread's whole dot product, so
    the result is the one-thread result to the bit."""
    import importlib.util

    with open(importlib.util.find_spec("sglang_dflash._C").origin, "rb") as f:
        assert b"GOMP_parallel" in f.read(), "sglang_dflash._C was built without OpenMP (-fopenmp)"
    x, w, b = case(M, 576, 1000, True, seed=M)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = OPS.bf16_linear(x, w, b)
        torch.set_num_threads(2)
        assert torch.get_num_threads() == 2
        two = OPS.bf16_linear(x, w, b)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    within_one_ulp(two, x, w, b)


@pytest.mark.parametrize("bias", [False, True])
def test_a_row_does_not_depend_on_the_rows_beside_it(bias):
    """A verify of W rows must give each row what a narrower verify gives it, to the bit (the wide
    block shapes only regroup the same dot products): every row count 3..13, 16, 24, 48, 64 against
    3-row calls, and on the native-bf16 path (every row count one arithmetic) against 1-row calls.
    Columns 0..133 cover the 4-column tiles and the column tail; K 576 and 1536 are the target's."""
    for K in (576, 1536):
        x, w, b = case(66, K, 134, bias, seed=K)
        narrow3 = torch.cat([OPS.bf16_linear(x[i : i + 3], w, b) for i in range(0, 66, 3)])[:64]
        one = torch.cat([OPS.bf16_linear(x[i : i + 1], w, b) for i in range(64)])
        for M in [*range(3, 14), 16, 24, 48, 64]:
            y = OPS.bf16_linear(x[:M], w, b)
            assert torch.equal(y, narrow3[:M]), (K, M)
            if kernels.cpu_isa()[0] in ("avx512bf16", "amx"):
                assert torch.equal(y, one[:M]), (K, M)
