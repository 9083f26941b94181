"""DFlash 2's config fields: the dynamic convolutions and the candidate path selector, parsed and
checked (all four core fields together or none: a DFlash 1 checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang_dflash.model.config_fields import DrafterConfigError, dflash_field


@dataclass
class DFlash2Config:
    """DFlash 2 additions: two-tap grouped dynamic convolutions and the candidate path selector."""

    conv_kernel_size: int  # taps per dynamic convolution (2)
    conv_group_size: int  # channels sharing one dynamic coefficient (16)
    selector_rank: int  # rank of the predecessor/successor codebooks (256)
    selector_top_k: int  # candidates kept per block position (16)
    output_multiplier: float = 1.0  # scales candidate logits before the selector scores them
    final_logit_softcapping: Optional[float] = None  # cap * tanh(logit / cap) on candidate logits
    selector_walk: str = "best"  # a greedy draft's path: "best" (Viterbi) or "chain" (path_walk.py)

    @property
    def uses_conv(self) -> bool:
        return self.conv_kernel_size > 0


DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
SELECTOR_WALKS = ("best", "chain")


def parse_dflash2(cfg: dict, hidden: int) -> Optional[DFlash2Config]:
    """None for a DFlash 1 checkpoint; the DFlash 2 fields (all four required together) otherwise."""
    present = [k for k in DFLASH2_FIELDS if dflash_field(cfg, k) is not None]
    if not present:
        return None
    missing = [k for k in DFLASH2_FIELDS if k not in present]
    if missing:
        raise DrafterConfigError(
            f"DFlash 2 drafter config sets {present} but lacks {missing}; a DFlash 2 "
            "checkpoint needs all of conv_kernel_size, conv_group_size, selector_rank, "
            "selector_top_k (in dflash_config)"
        )
    d = {k: dflash_field(cfg, k) for k in DFLASH2_FIELDS}
    for k, v in d.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if k == "conv_kernel_size" else 1):
            raise DrafterConfigError(f"dflash_config.{k} must be a positive int, got {v!r}")
    if hidden % d["conv_group_size"]:
        raise DrafterConfigError(
            f"dflash_config.conv_group_size={d['conv_group_size']} must divide hidden_size={hidden}"
        )
    mult = dflash_field(cfg, "output_multiplier", 1.0)
    cap = dflash_field(cfg, "final_logit_softcapping")
    if not isinstance(mult, (int, float)) or mult <= 0:
        raise DrafterConfigError(f"drafter config output_multiplier must be a positive number, got {mult!r}")
    if cap is not None and (not isinstance(cap, (int, float)) or cap <= 0):
        raise DrafterConfigError(
            f"drafter config final_logit_softcapping must be a positive number or null, got {cap!r}"
        )
    walk = dflash_field(cfg, "selector_walk", "best")
    if walk not in SELECTOR_WALKS:
        raise DrafterConfigError(f"dflash_config.selector_walk must be one of {SELECTOR_WALKS}, got {walk!r}")
    return DFlash2Config(
        **d, output_multiplier=float(mult), final_logit_softcapping=cap and float(cap), selector_walk=walk
    )
