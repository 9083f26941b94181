"""Grow a drafter deeper without starting over: L -> L + n layers whose forward equals the parent's.

The new layers go after the parent's last one (before the final norm) with their two output
projections (attention o_proj, MLP down_proj) zero: each is then an identity residual block, so the
grown drafter drafts exactly what the parent drafts and training starts from the parent's
acceptance, keeping the CPU-minutes already spent on it. The other weights of a new layer come from
  - `copy`: the parent's last layer (a second copy of what already works), or
  - `target`: one of the target's own decoder layers of the same shape (the last ones, in order),
    q/k norms (which Llama targets lack) at 1.
Gradients reach the zero projections first (their inputs are not zero), then the rest.

python -m sglang_dflash.train grow --drafter PARENT --num-layers 4 --grow-init copy --out DIR
then `train all --init-from DIR --num-layers 4 ...` trains it (train/warm_start.py).
"""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import save_file

from sglang_dflash.model.config import DrafterConfigError
from sglang_dflash.model.loader import read_state_dict

ZERO = ("self_attn.o_proj.weight", "mlp.down_proj.weight")  # the residual branches' last projections
INITS = ("copy", "target")
# drafter layer weight -> the target's (HF Llama / Qwen names under model.layers.N.)
FROM_TARGET = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
)


def _target_layer(target: str, index: int) -> dict[str, torch.Tensor]:
    state = read_state_dict(target)  # HF names with the "model." prefix stripped
    pre = f"layers.{index}."
    return {k[len(pre) :]: v for k, v in state.items() if k.startswith(pre)}


def grow(parent: str, out: str, num_layers: int, init: str = "copy", target: str | None = None) -> dict:
    """Write the grown drafter to `out` (config.json + model.safetensors); returns its config dict."""
    if init not in INITS:
        raise ValueError(f"--grow-init {init!r}: one of {INITS}")
    with open(os.path.join(parent, "config.json")) as f:
        cfg = json.load(f)
    have = int(cfg["num_hidden_layers"])
    if num_layers <= have:
        raise DrafterConfigError(f"grow: --num-layers {num_layers} must exceed the parent's {have} layers")
    state = read_state_dict(parent)
    last = {k[len(f"layers.{have - 1}.") :]: v for k, v in state.items() if k.startswith(f"layers.{have - 1}.")}
    n_target = int(cfg.get("num_target_layers", 0))
    for i in range(have, num_layers):
        layer = {k: v.clone() for k, v in last.items()}
        if init == "target":
            if target is None or n_target <= 0:
                raise DrafterConfigError("grow --grow-init target needs --model and the parent's num_target_layers")
            src = _target_layer(target, n_target - (num_layers - i))  # the target's last layers, in order
            for k in FROM_TARGET:
                if k not in src or src[k].shape != layer[k].shape:
                    raise DrafterConfigError(
                        f"grow: target weight {k!r} missing or of another shape than the drafter's"
                    )
                layer[k] = src[k].to(layer[k].dtype).clone()
            for k in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
                if k in layer:
                    layer[k] = torch.ones_like(layer[k])
        for k in ZERO:
            layer[k] = torch.zeros_like(layer[k])
        state.update({f"layers.{i}.{k}": v for k, v in layer.items()})
    cfg["num_hidden_layers"] = num_layers
    if isinstance(cfg.get("layer_types"), list):  # new layers attend as the parent's last one does
        cfg["layer_types"] = cfg["layer_types"] + [cfg["layer_types"][-1]] * (num_layers - have)
    os.makedirs(out, exist_ok=True)
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if os.path.exists(os.path.join(parent, "README.md")) and os.path.abspath(parent) != os.path.abspath(out):
        shutil.copy(os.path.join(parent, "README.md"), os.path.join(out, "PARENT_CARD.md"))
    return cfg
