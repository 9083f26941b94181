"""The target's linear weights packed once for oneDNN (csrc/cpu/packed_linear_cpu.cpp), for the bf16 GEMMs
wider than bf16_linear takes (cpu_linear.py's row bound: verify steps of many rows, prefill chunks).

torch's linear hands oneDNN the plain weight, which oneDNN reorders into its blocked layout on every
call; packed once (torch's own mkldnn::_reorder_linear_weight), the same oneDNN kernel computes the
same bits without the reorder. Measured on a 2-core Xeon with AMX (one thread, the embedded target's
GEMMs a step): 40 / 52 / 72 ms at 16 / 64 / 128 rows -> 24 / 35 / 52. The cost is a second copy of
the target's linear weights in memory. After SGLang updates the weights (from disk, tensors, IPC or
a distributed group) the worker packs them again (plugin.py's hooks); a weight not packed takes
torch's linear, never a stale copy.
SGLANG_DFLASH_CPU_OPS packed=: `auto` (default: where the CPU has AMX bf16 tiles, where it was measured:
served with the batch held full at 16 and 32 requests, run `2026-12-06-2bf34dc`, every packed /
unpacked pair >= 1.00x, width 1 +29% / +16%, adaptive +18% / +4%; docs/serving.md), `1` (wherever
torch's oneDNN packs bf16), `0` (off).
"""

from __future__ import annotations

import logging

import torch

from sglang_dflash import env

logger = logging.getLogger("sglang_dflash")

PACK_ROWS = 64  # the row count oneDNN tunes the layout for: a width-4 verify of 16 requests
_state = {"model": None, "packed": 0}


def wanted(amx: bool) -> bool:
    """amx: the CPU has AMX bf16 tiles (cpu_linear.amx_bf16())."""
    v = env.cpu_op("packed")
    return v == "1" or (v == "auto" and amx)


def enable(model: torch.nn.Module, amx: bool) -> int:
    """At the DFLASH worker's start (its bf16 CPU GEMMs routed): pack the target when wanted."""
    return pack(model) if wanted(amx) else 0


def linear_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """Each distinct 2-D bf16 CPU weight of the target's linear layers and LM head, once."""
    seen, out = set(), []
    for m in model.modules():
        kind = type(m).__name__
        w = getattr(m, "weight", None)
        if not (kind.endswith("Linear") or kind == "ParallelLMHead") or not isinstance(w, torch.Tensor):
            continue
        if w.dim() == 2 and w.dtype == torch.bfloat16 and w.device.type == "cpu" and w.is_contiguous():
            if w.data_ptr() not in seen:
                seen.add(w.data_ptr())
                out.append(w)
    return out


def pack_all(weights: list[torch.Tensor]) -> int:
    """Pack these weights (replacing any earlier packs); returns how many were packed."""
    ops = torch.ops.sglang_dflash
    ops.unpack_linears()
    _state["packed"] = sum(bool(ops.pack_linear(w, PACK_ROWS)) for w in weights)
    return _state["packed"]


def pack(model: torch.nn.Module) -> int:
    """Pack the target's weights; returns how many were packed."""
    n = pack_all(linear_weights(model))
    _state["model"] = model
    logger.info(f"sglang_dflash: {n} target weights packed for oneDNN (GEMMs past bf16_linear's rows)")
    return n


def repack(original, self, *args, **kwargs):
    """AFTER-style AROUND hook on SGLang's weight updates: the new weights packed again."""
    out = original(self, *args, **kwargs)
    if _state["model"] is not None:
        pack(_state["model"])
    return out


def count() -> int:
    """How many target weights are packed now."""
    return _state["packed"]


def on() -> bool:
    return _state["packed"] > 0


def linear(x: torch.Tensor, w: torch.Tensor, bias=None) -> torch.Tensor:
    """x [..., in] @ w [out, in]^T (+ bias) by oneDNN on w's packed copy where there is one."""
    if on() and x.device.type == "cpu":
        return torch.ops.sglang_dflash.packed_linear(x, w, bias)
    return torch.nn.functional.linear(x, w, bias)
