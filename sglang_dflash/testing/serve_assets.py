"""`python -m sglang_dflash.testing.serve_assets DIR`: the tiny target + drafter `make serve` runs.

A steered pair (see tiny_drafter.py) so the drafter is right part of the time and speculation is
visible (tau > 1) without a trained drafter. Built once (folder_cache.py); reruns are instant.
"""

from __future__ import annotations

import os
import sys

from sglang_dflash.folder_cache import build_once
from sglang_dflash.testing.tiny_drafter import make_tiny_drafter, steer_target
from sglang_dflash.testing.tiny_models import tiny_model_cache

MIXED_STRENGTH = 230.0  # target proposes the steer token ~2/3 of the time (measured)


def build_pair(
    out_dir: str, kind: str = "llama", dtype: str = "float32", strength: float = MIXED_STRENGTH, block_size: int = 16
) -> tuple[str, str]:
    def build(tmp: str) -> None:
        target = steer_target(str(tiny_model_cache(kind, dtype)), os.path.join(tmp, "target"), strength)
        make_tiny_drafter(os.path.join(tmp, "drafter"), target, block_size=block_size, steer=True)

    build_once(out_dir, build)
    return os.path.join(out_dir, "target"), os.path.join(out_dir, "drafter")


if __name__ == "__main__":
    print(*build_pair(sys.argv[1]))
