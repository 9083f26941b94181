"""Load a z-lab DFlash checkpoint folder (config.json + *.safetensors) into DFlashDrafter."""

from __future__ import annotations

import glob
import os

import torch
from safetensors.torch import load_file

from sglang_dflash.model.config import DrafterConfig, DrafterConfigError
from sglang_dflash.model.draft_vocab import check_d2t
from sglang_dflash.model.drafter import DFlashDrafter

# Prefixes some exporters put in front of the z-lab names.
_STRIP_PREFIXES = ("model.", "draft_model.")


def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise DrafterConfigError(f"drafter checkpoint {path!r} has no *.safetensors weights")
    state = {}
    for f in files:
        for k, v in load_file(f).items():
            for p in _STRIP_PREFIXES:
                if k.startswith(p):
                    k = k[len(p) :]
            state[k] = v
    return state


def load_drafter(path: str, cfg: DrafterConfig, dtype: torch.dtype, device: str) -> DFlashDrafter:
    state = read_state_dict(path)
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    expected = dict(model.named_parameters()) | dict(model.named_buffers())
    state.pop("t2d", None)  # EAGLE-3 exports store it beside d2t; it follows from d2t
    if cfg.draft_vocab_size and "d2t" in state:
        check_d2t(state["d2t"], cfg.draft_vocab_size, cfg.vocab_size, path)
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing:
        raise DrafterConfigError(
            f"drafter checkpoint {path!r} is missing weights: {missing[:8]}{' ...' if len(missing) > 8 else ''}"
        )
    if extra:
        raise DrafterConfigError(
            f"drafter checkpoint {path!r} has unexpected weights: {extra[:8]}{' ...' if len(extra) > 8 else ''}"
        )
    for name, param in expected.items():
        if tuple(state[name].shape) != tuple(param.shape):
            raise DrafterConfigError(
                f"drafter weight '{name}' has shape {tuple(state[name].shape)}, config implies "
                f"{tuple(param.shape)}; config.json and the weights disagree"
            )
    model = model.to_empty(device=device)
    model.load_state_dict({k: v if k == "d2t" else v.to(dtype) for k, v in state.items()})
    return model.to(dtype).eval().requires_grad_(False).fuse_projections()
