"""csrc/cpu/rope_cpu.cpp: rope_qk equals SGLang's RotaryEmbedding.forward_native bit for bit on bf16 q/k
(neox and GPT-J styles, a partial rotary dim, fp32 and bf16 caches, GQA head counts, empty), opcheck,
bad input, and the serving hook routing only a DFLASH server's bf16 rotary embeddings to it."""

import pytest
import torch

from plugin_hooks import apply_plugin_hook
from sglang_dflash import kernels
from sglang_dflash.kernels.reference import rope_qk_ref
from sglang_dflash.cpu import cpu_linear

OPS = kernels.ops()


def case(T=5, hq=9, hk=3, head=64, rd=64, cache_dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    inv = 1.0 / (10000 ** (torch.arange(0, rd, 2).float() / rd))
    freqs = torch.arange(512).float()[:, None] * inv[None]
    cache = torch.cat([freqs.cos(), freqs.sin()], -1).to(cache_dtype)
    pos = torch.randint(0, 512, (T,), generator=g)
    q = torch.randn(T, hq * head, generator=g).bfloat16()
    k = torch.randn(T, hk * head, generator=g).bfloat16()
    return pos, q, k, cache


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rd", [64, 32])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T", [1, 16, 64])
def test_equals_sglang_rotary_embedding(neox, rd, cache_dtype, T):
    from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

    install_cpu_shims()
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    pos, q, k, cache = case(T=T, rd=rd, cache_dtype=cache_dtype)
    rope = RotaryEmbedding(64, rd, 512, 10000, neox, torch.bfloat16)
    rope.cos_sin_cache = cache
    want = rope.forward_native(pos, q.clone(), k.clone())
    got = OPS.rope_qk(pos, q, k, cache, 64, neox)
    ref = rope_qk_ref(pos, q, k, cache, 64, neox)
    for w, g_, r in zip(want, got, ref):
        assert torch.equal(g_, w) and torch.equal(r, w)


def test_shapes_empty_opcheck_and_inputs_untouched():
    pos, q, k, cache = case()
    q3, k3 = q.view(5, 9, 64), k.view(5, 3, 64)
    before = q3.clone()
    out_q, out_k = OPS.rope_qk(pos, q3, k3, cache, 64, True)
    assert out_q.shape == q3.shape and out_k.shape == k3.shape and torch.equal(q3, before)
    e = OPS.rope_qk(pos[:0], q[:0], k[:0], cache, 64, True)
    assert e[0].shape == (0, 576) and e[1].shape == (0, 192)
    torch.library.opcheck(OPS.rope_qk, (pos, q, k, cache, 64, True))


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_strided_rows_and_any_cache_dtype_equal_the_reference(cache_dtype):
    # q and k as the layer op hands them: narrowed from one fused [T, q + 2 kv] output, rows not dense
    pos, q, k, cache = case(T=7, cache_dtype=cache_dtype)
    qkv = torch.cat([q, k, torch.randn_like(k)], -1)
    qn, kn = qkv.narrow(-1, 0, q.shape[1]), qkv.narrow(-1, q.shape[1], k.shape[1])
    assert not qn.is_contiguous()
    got = OPS.rope_qk(pos, qn, kn, cache, 64, True)
    for g_, r in zip(got, rope_qk_ref(pos, q, k, cache, 64, True)):
        assert g_.is_contiguous() and torch.equal(g_, r)


def test_bad_input_names_the_field():
    pos, q, k, cache = case()
    with pytest.raises(RuntimeError, match="bfloat16"):
        OPS.rope_qk(pos, q.float(), k, cache, 64, True)
    with pytest.raises(RuntimeError, match="rotary_dim"):
        OPS.rope_qk(pos, q, k, cache[:, :63], 64, True)
    with pytest.raises(RuntimeError, match="whole heads"):
        OPS.rope_qk(pos, q[:, :100], k, cache, 64, True)
    with pytest.raises(RuntimeError, match="rope_qk: position 512 outside"):
        OPS.rope_qk(torch.full_like(pos, 512), q, k, cache, 64, True)


def test_hook_routes_only_when_enabled(monkeypatch):
    from types import SimpleNamespace

    pos, q, k, cache = case()
    rope = SimpleNamespace(cos_sin_cache=cache, head_size=64, is_neox_style=True)
    original = lambda self, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None: "torch"  # noqa: E731
    monkeypatch.setattr(cpu_linear, "wanted", lambda device, dtype: dtype == torch.bfloat16)
    assert not cpu_linear.enable("cpu", torch.float32)
    assert cpu_linear.rope_forward(original, rope, pos, q, k) == "torch"
    assert cpu_linear.enable("cpu", torch.bfloat16)
    try:
        got = cpu_linear.rope_forward(original, rope, pos, q, k)
        want = rope_qk_ref(pos, q, k, cache, 64, True)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert cpu_linear.rope_forward(original, rope, pos, q, k, offsets=pos) == "torch"
        many = case(T=cpu_linear.ROPE_MAX_TOKENS + 1)
        assert cpu_linear.rope_forward(original, rope, *many[:3]) == "torch"  # past the measured crossover
        assert cpu_linear.rope_forward(original, rope, pos, q.float(), k.float()) == "torch"
        assert (
            cpu_linear.rope_forward(original, SimpleNamespace(**vars(rope), sin_cos_cache=cache), pos, q, k) == "torch"
        )
    finally:
        cpu_linear.enable("cpu", torch.float32)
    # SGLANG_DFLASH_CPU_OPS rope=1 routes rope without the GEMM kernel (a native-bf16 host), 0 never
    monkeypatch.setattr(cpu_linear, "wanted", lambda device, dtype: False)
    monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "rope=1")
    try:
        assert not cpu_linear.enable("cpu", torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(cpu_linear.rope_forward(original, rope, pos, q, k), want))
        assert (
            not cpu_linear.enable("cuda", torch.bfloat16)
            and cpu_linear.rope_forward(original, rope, pos, q, k) == "torch"
        )
        monkeypatch.setattr(cpu_linear, "wanted", lambda device, dtype: True)
        monkeypatch.setenv("SGLANG_DFLASH_CPU_OPS", "rope=0")
        assert cpu_linear.enable("cpu", torch.bfloat16)
        assert cpu_linear.rope_forward(original, rope, pos, q, k) == "torch"
    finally:
        monkeypatch.delenv("SGLANG_DFLASH_CPU_OPS")
        cpu_linear.enable("cpu", torch.float32)


def test_plugin_hook_reaches_the_rotary_embedding_sglang_runs(monkeypatch):
    """The plugin's hook sits on the method SGLang's RotaryEmbedding dispatches to on this CPU (without
    AMX: forward_native): rope_qk runs inside a real module call, with SGLang's own result."""
    from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

    install_cpu_shims()
    apply_plugin_hook(monkeypatch, cpu_linear.rope_forward)
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    pos, q, k, cache = case()
    rope = RotaryEmbedding(64, 64, 512, 10000, True, torch.bfloat16)
    rope.cos_sin_cache = cache
    want = rope_qk_ref(pos, q, k, cache, 64, True)
    monkeypatch.setattr(cpu_linear, "wanted", lambda device, dtype: True)
    cpu_linear.enable("cpu", torch.bfloat16)
    try:
        with torch.profiler.profile() as prof:
            got = rope(pos, q, k)
    finally:
        cpu_linear.enable("cpu", torch.float32)
    assert any(e.name == "sglang_dflash::rope_qk" for e in prof.events())
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
def test_vector_path_keeps_the_bits(cache_dtype):
    """The AVX-512 rotation (neox, 16 pairs a step, c10's rounding) on products past bf16's range,
    infinities, a NaN, rounding ties, a partial rotary dim: the reference bit for bit, NaN where it has
    NaN, at one and two threads and on more tokens than one thread's share."""
    before = torch.get_num_threads()
    for rd in (64, 32):
        pos, q, k, cache = case(T=40, rd=rd, cache_dtype=cache_dtype, seed=3)
        q[2, :6] = torch.tensor([3.0e38, -3.0e38, float("inf"), 1.00390625, -2.0078125, 0.0])
        q[2, 32:38] = torch.tensor([3.0e38, 3.0e38, 1.0, 0.00390625, -0.0078125, -0.0])
        k[5, 7] = float("nan")
        want = rope_qk_ref(pos, q, k, cache, 64, True)
        try:
            for n in (1, 2):
                torch.set_num_threads(n)
                for a, b in zip(OPS.rope_qk(pos, q, k, cache, 64, True), want):
                    assert torch.equal(a.isnan(), b.isnan()) and a.isnan().any() == (b is want[1])
                    assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
        finally:
            torch.set_num_threads(before)
