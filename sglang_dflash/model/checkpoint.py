"""Drafter checkpoint folders written and read back: the one place a trained drafter becomes the
folder the server loads (config.json + model.safetensors), and is loaded through the server's own
loader and start-up checks (beside loader.py)."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file


def write_checkpoint(out: str, config: dict, state: dict[str, torch.Tensor]) -> str:
    """config: z-lab config dict; state: DFlashDrafter state dict -> OUT folder (bf16 weights)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({**config, "torch_dtype": "bfloat16"}, f, indent=1)
    save_file(
        {k: (v if k == "d2t" else v.detach().to(torch.bfloat16)).contiguous() for k, v in state.items()},
        os.path.join(out, "model.safetensors"),
    )
    os.chmod(os.path.join(out, "model.safetensors"), 0o644)
    return out


def load_exported(out: str, model: str, dtype=torch.bfloat16):
    """The exported folder through the server's own loader and start-up checks."""
    from sglang_dflash.model.config import check_against_target, load_drafter_config
    from sglang_dflash.model.loader import load_drafter
    from sglang_dflash.model.mask_token import resolve_mask_token_id

    with open(os.path.join(model, "config.json")) as f:
        t = json.load(f)
    cfg = load_drafter_config(out, t["num_hidden_layers"])
    check_against_target(cfg, hidden_size=t["hidden_size"], vocab_size=t["vocab_size"])
    mask = resolve_mask_token_id(cfg, model, t["vocab_size"])
    return load_drafter(out, cfg, dtype, "cpu"), cfg, mask
