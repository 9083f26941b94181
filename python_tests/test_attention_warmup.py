"""The drafter's block attention is warmed up at start-up (DFlashWorker.init_attention_backends ->
attention_choice.warm_up_block_attention): a FlashInfer JIT, plan or run failure is a start-up error
naming FlashInfer, not a per-step fallback. FlashInfer itself is replaced by a CPU stand-in (or a
failing one: fault injection); the rest of the path is the decode step's own. No server."""

import ast
import os

import pytest
import torch

from sglang_dflash.model.config import parse_drafter_config
from sglang_dflash.pipeline import flashinfer_attention as fa
from sglang_dflash.pipeline.context_kv import DraftKVCache
from sglang_dflash.pipeline import attention_choice
from sglang_dflash.testing.fake_flashinfer import FakePrefillWrapper
from sglang_dflash.testing.tiny_config import tiny_cfg_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = 4


def drafter(dtype=torch.bfloat16, **overrides):
    cfg = parse_drafter_config(tiny_cfg_dict(**overrides), 4)
    return cfg, DraftKVCache(cfg.num_layers, 32, cfg.num_kv_heads, cfg.head_dim, dtype, "cpu")


class Failing(FakePrefillWrapper):
    def __init__(self, stage):
        super().__init__()
        self.stage, self.error = stage, RuntimeError("nvcc: JIT compilation of batch_prefill failed")

    def plan(self, *args, **kw):
        if self.stage == "plan":
            raise self.error
        super().plan(*args, **kw)

    def run(self, q, paged):
        if self.stage == "run":
            raise self.error
        out = super().run(q, paged)
        return out * float("nan") if self.stage == "nan" else out


def install(monkeypatch, make):
    seen = []

    def wrapper(dev, left, backend, fixed=None):
        seen.append(backend)
        return make()

    monkeypatch.setattr(fa, "_wrapper", wrapper)
    return seen


def test_warm_up_runs_flashinfer_path_with_pinned_backend(monkeypatch):
    seen = install(monkeypatch, FakePrefillWrapper)
    cfg, kv = drafter()
    attention_choice.warm_up_block_attention(cfg, B, True, kv)
    assert seen and set(seen) == {"fa2"}, "FlashInfer backend must be pinned to SGLang's fa2 by default"
    monkeypatch.setenv("SGLANG_DFLASH_FLASHINFER_BACKEND", "fa3")
    seen.clear()
    attention_choice.warm_up_block_attention(cfg, B, True, kv)
    assert set(seen) == {"fa3"}


@pytest.mark.parametrize("stage", ["plan", "run", "nan"])
def test_flashinfer_warm_up_failure_is_a_start_up_error(monkeypatch, stage):
    install(monkeypatch, lambda: Failing(stage))
    cfg, kv = drafter()
    with pytest.raises(RuntimeError, match="FlashInfer block attention failed its start-up warm-up") as e:
        attention_choice.warm_up_block_attention(cfg, B, True, kv)
    msg = str(e.value)
    assert "4 query / 2 KV heads, head_dim 8, torch.bfloat16 cache, block 4, backend fa2" in msg
    assert "SGLANG_DFLASH_FLASHINFER_BACKEND" in msg and "Fix:" in msg
    cause = "non-finite values" if stage == "nan" else "RuntimeError: nvcc: JIT compilation of batch_prefill failed"
    assert cause in msg and e.value.__cause__ is not None


def test_import_failure_of_flashinfer_is_a_start_up_error(monkeypatch):
    def wrapper(dev, left, backend, fixed=None):
        raise ImportError("No module named 'flashinfer'")

    monkeypatch.setattr(fa, "_wrapper", wrapper)
    cfg, kv = drafter(torch.float16)
    with pytest.raises(RuntimeError, match="FlashInfer block attention failed.*No module named 'flashinfer'"):
        attention_choice.warm_up_block_attention(cfg, B, True, kv)


def test_torch_path_on_cpu_and_float32_warm_up_without_flashinfer(monkeypatch):
    seen = install(monkeypatch, lambda: Failing("plan"))
    for cuda, dtype in ((False, torch.bfloat16), (True, torch.float32)):  # float32: FlashInfer has no kernels
        cfg, kv = drafter(dtype)
        attention_choice.warm_up_block_attention(cfg, B, cuda, kv)
    assert seen == []


def test_torch_warm_up_failure_names_torch(monkeypatch):
    def broken(*args):
        raise ValueError("bad table")

    cfg, kv = drafter(torch.float32)
    with pytest.raises(RuntimeError, match=r"block attention \(torch\) failed its start-up warm-up.*bad table"):
        attention_choice.warm_up_block_attention(cfg, B, False, kv, attention=broken)


def test_worker_start_up_calls_the_warm_up():
    # The worker imports SGLang; read its source instead: SGLang calls init_attention_backends once
    # at start-up, after alloc_memory_pool made the draft KV cache.
    tree = ast.parse(open(os.path.join(ROOT, "sglang_dflash", "srt", "worker.py")).read())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "init_attention_backends")
    calls = [n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert calls == ["warm_up_block_attention"], calls


def mask_layout(req_to_token, rows, kv_lens):
    """The boolean-mask form the gather replaced (one nonzero sync on a GPU)."""
    table = req_to_token[rows.long()]
    return table[torch.arange(table.shape[1])[None, :] < kv_lens[:, None]].to(torch.int32)


@pytest.mark.parametrize("seed", range(5))
def test_paged_kv_layout_equals_the_mask_form(seed):
    g = torch.Generator().manual_seed(seed)
    req_to_token = torch.randint(0, 10_000, (9, 40), generator=g, dtype=torch.int32)
    rows = torch.randperm(9, generator=g)[:6]
    kv_lens = torch.randint(0, 41, (6,), generator=g)
    kv_lens[seed % 6] = 0  # an empty request must not shift its neighbours
    indptr, indices = fa.paged_kv_layout(req_to_token, rows, kv_lens)
    assert indptr.device.type == "cpu" and indptr.dtype == torch.int32
    assert indptr.tolist() == [0] + torch.cumsum(kv_lens, 0).tolist()
    assert torch.equal(indices, mask_layout(req_to_token, rows, kv_lens))
