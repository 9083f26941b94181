"""Pure-torch stand-ins for the ``sgl_kernel`` CPU ops SGLang imports at start-up.

On a machine without a GPU, ``import sgl_kernel`` fails (its wheel is a CUDA
build that needs ``libcuda.so.1``), yet with ``SGLANG_USE_CPU_ENGINE=1`` SGLang
imports these CPU ops at module level:

  sglang/srt/mem_cache/allocation.py               assign_req_to_token_pool_cpu
  sglang/kernels/ops/kvcache/cache_move.py         copy_all_layer_kv_cache_cpu
  sglang/kernels/ops/speculative/cache_locs.py     assign_extend_cache_locs_cpu,
                                                   assign_draft_cache_locs_contiguous_cpu
  sglang/kernels/ops/speculative/eagle.py          fill_accept_out_cache_loc_cpu,
                                                   fill_bonus_tokens_cpu
  sglang/kernels/ops/speculative/multi_layer_eagle.py  rotate_input_ids_cpu
  sglang/kernels/ops/speculative/spec_tree.py      build_tree_kernel_efficient_cpu,
                                                   verify_tree_greedy_cpu

``install_cpu_shims()`` registers a small stand-in ``sgl_kernel`` module holding
torch versions of these (the tree kernels raise NotImplementedError: EAGLE/ngram
trees only; DFlash verifies a linear block). The stand-in registers no
``torch.ops.sgl_kernel`` ops, so SGLang's ``hasattr(torch.ops.sgl_kernel, ...)``
probes (Intel AMX backend, fused qk-norm, ...) stay False and it keeps its
pure-torch paths; ``from sgl_kernel import <anything else>`` raises ImportError
exactly as when the package is missing.

Other start-up obstacles, handled or noted here:
  * spawn children import sgl_kernel before they load plugins: see _ShimsOnUnpickle.
  * ``sglang.Engine`` (offline) imports sgl_kernel when the attribute is first
    touched, before ``Engine.__init__`` loads plugins: scripts must call
    ``install_cpu_shims()`` before using ``sglang.Engine``.
  * Model files that read ``torch.ops.sgl_kernel.<op>`` at import (qwen3_5, grok,
    minicpmv, ...) fail to import; SGLang's model registry logs "Ignore import
    error" and skips them. Llama and Qwen3 are unaffected.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import multiprocessing
import os
import sys
import types

import torch

from sglang_dflash import env

logger = logging.getLogger(__name__)

_STATE = {"done": False, "installed": False}


# ---------------------------------------------------------------- helpers
def _segments(starts: torch.Tensor, ends: torch.Tensor):
    """For per-row half-open ranges [start, end): (row id, column) per element."""
    lens = (ends.long() - starts.long()).clamp_min(0)
    rows = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    first = torch.cumsum(lens, 0) - lens  # offset of each row's first element
    cols = starts.long()[rows] + torch.arange(rows.numel()) - first[rows]
    return rows, cols


# ------------------------------------------------------ KV-cache bookkeeping
def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """req_to_token[req[i], start[i]:end[i]] = next (end-start) entries of out_cache_loc."""
    rows, cols = _segments(start_offset, end_offset)
    if rows.numel():
        req = req_pool_indices.long()[rows]
        req_to_token[req, cols] = out_cache_loc[: rows.numel()].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """Reverse of the above: pack req_to_token[req[i], start[i]:end[i]] into out_cache_loc."""
    rows, cols = _segments(start_offset, end_offset)
    if rows.numel():
        req = req_pool_indices.long()[rows]
        out_cache_loc[: rows.numel()] = req_to_token[req, cols].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_cols
):
    """out[i*topk*num_cols + j] = req_to_token[req[i], seq_lens[i] + j], j < topk*num_cols."""
    n = int(topk) * int(num_cols)
    cols = seq_lens.long().view(-1, 1) + torch.arange(n).view(1, -1)
    vals = req_to_token[req_pool_indices.long().view(-1, 1), cols]
    out_cache_loc[: vals.numel()] = vals.reshape(-1).to(out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every KV buffer (base address data_ptrs[b], row size strides[b] bytes),
    copy row src_loc[k] to row tgt_loc[k]; reads happen before writes (in-place safe)."""
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.long(), src_loc.long()
    nrows = int(max(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        # View the first nrows rows of the buffer as bytes (no copy).
        raw = (ctypes.c_uint8 * (nrows * int(stride))).from_address(int(ptr))
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(nrows, int(stride))
        rows[tgt] = rows[src]  # advanced-index read makes a copy first


# ------------------------------------------------ speculative-decoding glue
def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """bonus[i] = accept_tokens.flat[i*stride + accept_lens[i] - 1] (last accepted token)."""
    bs = accept_lens.numel()
    idx = torch.arange(bs) * int(accept_stride) + accept_lens.long() - 1
    bonus_tokens[:bs] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """Compact out_cache_loc[accept_index[k]] over the accept_index entries != -1."""
    idx = accept_index.reshape(-1).long()
    idx = idx[idx >= 0]
    accept_out_cache_loc[: idx.numel()] = out_cache_loc[idx].to(accept_out_cache_loc.dtype)


def rotate_input_ids_cpu(input_ids, extend_start_loc, extend_seq_lens, topk_index, select_index):
    """Per request: shift its extend segment left by one and put topk_index[i] in the
    freed slot (the segment's last slot, or select_index[i] when given)."""
    for i, (s, n) in enumerate(zip(extend_start_loc.tolist(), extend_seq_lens.tolist())):
        if n <= 0:
            continue
        input_ids[s : s + n - 1] = input_ids[s + 1 : s + n].clone()
        last = int(select_index[i]) if select_index is not None else s + n - 1
        input_ids[last] = topk_index.reshape(-1)[i]


def _tree_kernel_unavailable(name):
    def stub(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available: sglang_dflash's CPU fallbacks cover "
            "linear (DFlash) speculation only, not EAGLE/ngram token trees."
        )

    stub.__name__ = name
    return stub


build_tree_kernel_efficient_cpu = _tree_kernel_unavailable("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _tree_kernel_unavailable("verify_tree_greedy_cpu")

SHIMMED = (
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
    "rotate_input_ids_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
)


# ----------------------------------------------------------------- install
def _real_sgl_kernel_works() -> bool:
    if "sgl_kernel" in sys.modules:
        return not getattr(sys.modules["sgl_kernel"], "__sglang_dflash_shim__", False)
    try:
        import sgl_kernel  # noqa: F401

        return True
    except Exception:  # ImportError (libcuda.so.1 missing), OSError, ...
        # A failed import leaves its already-imported submodules behind; drop them
        # so they cannot be mistaken for parts of the stand-in.
        for name in [m for m in sys.modules if m.startswith("sgl_kernel.")]:
            del sys.modules[name]
        return False


class _ShimsOnUnpickle:
    """Marker put in multiprocessing's per-process config so spawned children install
    the shims *while unpickling their Process object*.

    Obstacle: SGLang spawns the scheduler and detokenizer with the "spawn" start
    method. The child unpickles ``run_scheduler_process``/``run_detokenizer_process``,
    which imports their modules (and through them ``from sgl_kernel import ...``)
    before those functions get to call ``load_plugins()``. ``Process._config`` is
    pickled before ``Process._target``, so this marker is restored (and installs the
    stand-in) first. The child's own children inherit it the same way.
    """

    def __reduce__(self):
        return (_install_in_child, ())


def _install_in_child() -> "_ShimsOnUnpickle":
    install_cpu_shims()
    return _ShimsOnUnpickle()


def install_cpu_shims() -> bool:
    """Make SGLang's CPU path importable without a working sgl_kernel.

    No-op when the real sgl_kernel imports. Idempotent; returns True when the
    stand-in is (or already was) installed. Spawned child processes install it too.
    """
    if _STATE["done"]:
        return _STATE["installed"]
    _STATE["done"] = True
    if _real_sgl_kernel_works():
        return False
    mod = types.ModuleType("sgl_kernel", "sglang_dflash stand-in for sgl_kernel (CPU only)")
    mod.__sglang_dflash_shim__ = True
    # A spec keeps importlib.util.find_spec("sgl_kernel") from raising ValueError.
    mod.__spec__ = importlib.machinery.ModuleSpec("sgl_kernel", None)
    for name in SHIMMED:
        setattr(mod, name, globals()[name])
    sys.modules["sgl_kernel"] = mod
    multiprocessing.current_process()._config.setdefault("sglang_dflash_cpu_shims", _ShimsOnUnpickle())
    _STATE["installed"] = True
    # One warning per process tree: children inherit the environment variable.
    log = logger.debug if env.CPU_SHIMS_LOGGED.get() else logger.warning
    os.environ[env.CPU_SHIMS_LOGGED.name] = "1"
    log(
        "sgl_kernel is unavailable; using sglang_dflash pure-torch CPU fallbacks for: %s",
        ", ".join(SHIMMED),
    )
    return True
