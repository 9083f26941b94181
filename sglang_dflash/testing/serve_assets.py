"""`python -m sglang_dflash.testing.serve_assets DIR`: the tiny target + drafter `make serve` runs.

A steered pair (see tiny_drafter.py) so the drafter is right part of the time and speculation is
visible (tau > 1) without a trained drafter. Built once; a marker file makes reruns instant.
"""
from __future__ import annotations

import os
import sys

from sglang_dflash.testing.tiny_drafter import make_tiny_drafter, steer_target
from sglang_dflash.testing.tiny_models import tiny_model_cache

MIXED_STRENGTH = 230.0  # target proposes the steer token ~2/3 of the time (measured)


def build_pair(out_dir: str, kind: str = "llama", dtype: str = "float32", strength: float = MIXED_STRENGTH,
               block_size: int = 16) -> tuple[str, str]:
    target, drafter = os.path.join(out_dir, "target"), os.path.join(out_dir, "drafter")
    marker = os.path.join(out_dir, ".complete")
    if not os.path.exists(marker):
        steer_target(str(tiny_model_cache(kind, dtype)), target, strength)
        make_tiny_drafter(drafter, target, block_size=block_size, steer=True)
        open(marker, "w").close()
    return target, drafter


if __name__ == "__main__":
    print(*build_pair(sys.argv[1]))
