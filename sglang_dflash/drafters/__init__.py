"""Drafters this project trained and ships as package data (z-lab checkpoint format).

smollm2-135m-instruct-dflash: for the embedded target SmolLM2-135M-Instruct (see its README.md,
trained by `python -m sglang_dflash.train`).
"""
from __future__ import annotations

import os

DEFAULT = "smollm2-135m-instruct-dflash"


def shipped_drafter(name: str = DEFAULT) -> str:
    """Folder of a shipped drafter; a clear error when the installed package lacks its weights."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    if not os.path.isfile(os.path.join(path, "config.json")) or not any(
            f.endswith(".safetensors") for f in os.listdir(path)):
        raise FileNotFoundError(f"shipped drafter {name!r} is missing from {path}; reinstall sglang-dflash "
                                "(the wheel carries it as package data) or pass --speculative-draft-model-path")
    return path
