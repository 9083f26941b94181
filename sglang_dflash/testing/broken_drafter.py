"""Edited copies of a tiny drafter checkpoint for tests.

broken_drafter: a fault that raises nothing, its final norm weight set to NaN or inf, so every
proposal comes from non-finite logits (the output must stay the target's).
flat_drafter: a steered drafter whose q is spread out (the steer token's logit and the others scaled
down through the final norm), so a q truncated to its top 32 tokens and the drafter's q at the
request's temperature both differ from the full softmax: the served proposal-rule tests can tell
a broken rule apart (a steered drafter's q is a near point mass, where every rule looks the same).
"""

from __future__ import annotations

import os
import shutil
from typing import Callable

from safetensors.torch import load_file, save_file

from sglang_dflash.folder_cache import build_once

# Final-norm scales of the steer channel and of the other channels. Flatter others make q at T=0.5 and
# at T=1 barely differ (a broken rule then passes the served test); more peaked ones make a correct
# server's p-value fragile. 0.6 separates both (the p-values: bench/results/broken_rules.jsonl).
FLAT_STEER, FLAT_OTHERS = 0.004, 0.6


def edited_drafter(src: str, root: str, tag: str, edit: Callable[[dict], None]) -> str:
    """A copy of drafter folder `src` under `root` (cached by tag) with edit(tensors) applied."""

    def build(tmp: str) -> None:
        out = os.path.join(tmp, "drafter")
        shutil.copytree(src, out)
        path = os.path.join(out, "model.safetensors")
        tensors = load_file(path)
        if "norm.weight" not in tensors:
            raise KeyError(f"{src}: no norm.weight to edit")
        edit(tensors)
        save_file(tensors, path, metadata={"format": "pt"})

    return os.path.join(
        build_once(os.path.join(root, f"{tag}-{os.path.basename(os.path.dirname(src))}"), build), "drafter"
    )


def broken_drafter(src: str, root: str, value: float) -> str:
    tag = "broken-nan" if value != value else ("broken-inf" if value > 0 else "broken-ninf")
    return edited_drafter(src, root, tag, lambda t: t["norm.weight"].fill_(value))


def flat_drafter(src: str, root: str) -> str:
    from sglang_dflash.testing.tiny_drafter import STEER_CHANNEL

    def edit(t):
        w = t["norm.weight"]
        w.mul_(FLAT_OTHERS)
        w[STEER_CHANNEL] *= FLAT_STEER / FLAT_OTHERS

    return edited_drafter(src, root, f"flat-{FLAT_STEER}-{FLAT_OTHERS}", edit)
