"""Warm start: a training run that begins from an exported drafter's weights, not from noise.

The learning curve of the shipped drafter was still rising when its budget ended (held-out walk
tau +0.2 per doubling of trained tokens), and its optimizer state lives only in the workdir that
trained it. Exported weights are what survives a machine, so a longer run is a warm-started one.
The draft vocabulary (d2t) is re-chosen from this run's labels unless the run keeps the parent's
(parent_vocab: a run whose own labels are few or narrow keeps the vocabulary the whole chain's data
chose); the head is the target's own frozen LM head either way.
"""

from __future__ import annotations

import torch

from sglang_dflash.model.config import DrafterConfig, DrafterConfigError, load_drafter_config
from sglang_dflash.model.draft_vocab import ids_from_d2t
from sglang_dflash.model.loader import read_state_dict

# What must agree for the weights to mean the same thing in the new run.
SHAPE_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")
MEANING_FIELDS = ("block_size", "target_layer_ids", "mask_token_id")


def warm_start(drafter: torch.nn.Module, cfg: DrafterConfig, path: str, target_num_layers: int) -> int:
    """Copy the exported drafter at `path` into `drafter` (built from `cfg`); returns the tensors copied.
    A drafter of another shape or meaning fails here, naming the field and both values."""
    src = load_drafter_config(path, target_num_layers)
    for f in SHAPE_FIELDS + MEANING_FIELDS:
        a, b = getattr(src, f), getattr(cfg, f)
        if a != b:
            raise DrafterConfigError(
                f"--init-from {path!r}: its {f} is {a}, this run's is {b}; train with the same "
                f"{f} (e.g. --num-layers / --block-size) or start from scratch"
            )
    if (src.dflash2 is None) != (cfg.dflash2 is None):
        raise DrafterConfigError(f"--init-from {path!r}: DFlash 1 vs DFlash 2 drafters do not share weights")
    state = {k: v for k, v in read_state_dict(path).items() if k not in ("d2t", "t2d")}
    own = drafter.state_dict()
    missing = sorted(k for k in own if k not in state and k != "d2t")
    if missing:
        raise DrafterConfigError(f"--init-from {path!r} lacks weights {missing[:6]}")
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v.to(own[k].dtype))
    return len(state)


def parent_vocab(path: str) -> torch.Tensor:
    """The exported drafter's draft vocabulary: target token ids [N]; one without d2t fails by name."""
    d2t = read_state_dict(path).get("d2t")
    if d2t is None:
        raise DrafterConfigError(f"--keep-draft-vocab: {path!r} has no reduced draft vocabulary (no 'd2t' weight)")
    return ids_from_d2t(d2t)
