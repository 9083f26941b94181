"""The kernels tier of the GPU check (bench/checks/gpu_check.py) on CPU, case by case: the backend check,
every head layout, the fp8 cache write, and that its tolerance (relative to the output's scale)
catches a causal/non-causal mix-up. The whole script runs in test_builds.py (server-marked)."""

import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "checks"))
import gpu_check  # noqa: E402
from sglang_dflash.pipeline.attention import attend_rows  # noqa: E402


def test_backend_row_requires_the_extension(monkeypatch):
    assert gpu_check.check_backend("cpu")["ok"]
    monkeypatch.setattr(gpu_check.kernels, "load", lambda: "reference")
    assert not gpu_check.check_backend("cpu")["ok"], "the torch reference must not pass as the extension"


@pytest.mark.parametrize("layout", list(gpu_check.LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_attention_layouts(layout, dtype):
    row = gpu_check.check_block_attention("cpu", 3, 5, layout, dtype, reps=1)
    assert row["ok"], row
    assert row["layout"] == "/".join(map(str, gpu_check.LAYOUTS[layout])) and row["plan_ms"] > 0


class CausalBlock:
    """A block attention that wrongly masks the block causally: what the tolerance must catch."""

    def __init__(self, case, B, D):
        self.case, self.B, self.D = case, B, D

    def __call__(self, layer, q, kb, vb):
        kc, vc, _, prefix, block_slots, *_, kv_slots = self.case
        kc[layer].index_copy_(0, block_slots, kb.to(kc.dtype))
        vc[layer].index_copy_(0, block_slots, vb.to(vc.dtype))
        B = self.B
        rows = [
            attend_rows(q[i * B : (i + 1) * B], kc[layer][s], vc[layer][s], self.D**-0.5, causal_prefix=int(p))
            for i, (s, p) in enumerate(zip(kv_slots, prefix))
        ]
        return torch.cat(rows)


@pytest.mark.parametrize("layout", ["smollm2", "qwen3-8b"])
def test_tolerance_catches_a_causal_block(monkeypatch, layout):
    monkeypatch.setattr(gpu_check, "block_attention", lambda dev, case, B, H, D: CausalBlock(case, B, D))
    row = gpu_check.check_block_attention("cpu", 8, 4, layout, torch.bfloat16, reps=1)
    assert not row["ok"] and row["rel_err"] > 10 * gpu_check.REL_TOL[torch.bfloat16], row


def test_write_fp8_cache_with_scale():
    row = gpu_check.check_write("cpu", 64, torch.float32, L=2, T=64, cache_dtype=torch.float8_e4m3fn, kv_scale=0.5)
    assert row["ok"] and row["cache_dtype"] == "torch.float8_e4m3fn", row


def test_kernels_tier_needs_no_sglang():
    # A fresh GPU machine has torch, nvcc and FlashInfer only: the tier must import without the rest.
    bench = os.path.dirname(gpu_check.__file__)
    code = (
        "import sys\n"
        "for m in ('sglang', 'sgl_kernel', 'requests', 'safetensors', 'transformers'):\n"
        "    sys.modules[m] = None\n"
        "import gpu_check\n"
        "print(gpu_check.kernels.load())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(bench))}
    p = subprocess.run([sys.executable, "-c", code], cwd=bench, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "extension", p.stderr[-2000:]


def test_attention_takes_sdpa_output_in_gpu_layout(monkeypatch):
    """CUDA's fused SDPA kernels return [bs, heads, L, d] laid out as [bs, L, heads, d] (a view of it
    failed on the first H200 run); on CPU the output is contiguous, so the GPU layout is made here."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(4, 8, 64, generator=g), torch.randn(9, 2, 64, generator=g), torch.randn(9, 2, 64, generator=g)
    want = attend_rows(q, k, v, 0.125)
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **kw: sdpa(*a, **kw).transpose(1, 2).contiguous().transpose(1, 2)
    )
    assert torch.equal(attend_rows(q, k, v, 0.125), want)


def test_backend_row_asks_cuda_only_of_ops_with_a_cuda_kernel(monkeypatch):
    """The CPU-only ops (bf16 GEMM, norms) have no CUDA kernel by design; every other op must."""
    has = {}
    monkeypatch.setattr(gpu_check.kernels, "load", lambda: "extension")
    monkeypatch.setattr(
        torch._C, "_dispatch_has_kernel_for_dispatch_key", lambda op, key: has.setdefault((op, key), True)
    )
    assert gpu_check.check_backend("cuda")["ok"]
    cuda = {op for op, key in has if key == "CUDA"}
    assert cuda == {f"sglang_dflash::{n}" for n in gpu_check.kernels.SCHEMAS if n not in gpu_check.kernels.CPU_ONLY}
    assert {"sglang_dflash::write_draft_kv", "sglang_dflash::linear_verify_accept"} <= cuda
