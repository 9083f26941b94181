"""Weight interpolation of two drafters of one warm-start chain (WiSE-FT): (1 - w) x parent + w x child.

A warm start trained on a narrow mix (e.g. templated answers only) gains on its own held-out
split and loses on prompts unlike it; the parent and the child share their init and shapes, so the
straight line between them keeps most of the child's gain at the parent's generality. Tensors are
mixed in float32 and stored as the child's dtype; the draft vocabulary must be the same (d2t is
copied, not mixed).

python -m sglang_dflash.train mix --drafter PARENT --init-from CHILD --mix-weight 0.7 --out DIR
"""

from __future__ import annotations

import os
import shutil

import torch
from safetensors.torch import save_file

from sglang_dflash.model.config import DrafterConfigError
from sglang_dflash.model.loader import read_state_dict

EXACT = ("d2t", "t2d")  # integer maps: copied from the child, never averaged


def interpolate(parent: str, child: str, out: str, weight: float) -> dict[str, torch.Tensor]:
    """Write (1 - weight) x parent + weight x child to `out` (the child's config.json and card)."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"--mix-weight {weight}: must be in [0, 1] (the child's share)")
    sp, sc = read_state_dict(parent), read_state_dict(child)
    if sp.keys() != sc.keys():
        raise DrafterConfigError(
            f"mix: {parent!r} and {child!r} hold different weights: {sorted(sp.keys() ^ sc.keys())[:6]}"
        )
    for k in sc:
        if sp[k].shape != sc[k].shape or (k in EXACT and not torch.equal(sp[k], sc[k])):
            raise DrafterConfigError(
                f"mix: weight {k!r} differs in shape or draft vocabulary; mix one chain's drafters"
            )
    mixed = {
        k: v if k in EXACT else ((1 - weight) * sp[k].float() + weight * v.float()).to(v.dtype) for k, v in sc.items()
    }
    os.makedirs(out, exist_ok=True)
    save_file(mixed, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "README.md", "learning_curve.png"):
        if os.path.exists(os.path.join(child, name)) and os.path.abspath(child) != os.path.abspath(out):
            shutil.copy(os.path.join(child, name), out)
    return mixed
