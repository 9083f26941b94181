"""Tiny generated (target, drafter) pairs for tests and benches, built once per machine (cached on disk).

MIXED: a steered target that proposes the steer token only part of the time (acceptance lengths
vary); FORCED: one that always does (every block accepted whole). Measured per architecture on the
seed-0 tiny models.
"""

import os

from sglang_dflash import env
from sglang_dflash.folder_cache import build_once
from sglang_dflash.testing.tiny_drafter import make_tiny_drafter, steer_target
from sglang_dflash.testing.tiny_models import tiny_model_cache

ROOT = env.TEST_CACHE.get()
MIXED = {"llama": 230.0, "qwen3": 230.0}
FORCED = 2000.0


def pair(
    kind: str, dtype: str, strength: float | None, block: int = 16, layers: int = 2, draft_vocab: int = 0
) -> tuple[str, str]:
    """(target, drafter) paths. strength None -> the unmodified random target and a random drafter.
    draft_vocab N > 0: the drafter scores a reduced vocabulary of N tokens (d2t)."""
    base = str(tiny_model_cache(kind, dtype))
    target = base
    if strength is not None:  # one steered target per strength, shared by its drafters (and plain references)
        steered = build_once(
            os.path.join(ROOT, f"steered-{kind}-{dtype}-{strength}-v2"),
            lambda tmp: steer_target(base, os.path.join(tmp, "target"), strength),
        )
        target = os.path.join(steered, "target")

    def build(tmp: str) -> None:
        make_tiny_drafter(
            os.path.join(tmp, "drafter"),
            target,
            block_size=block,
            num_layers=layers,
            steer=strength is not None,
            draft_vocab=draft_vocab,
        )

    vocab = f"-dv{draft_vocab}" if draft_vocab else ""
    d = build_once(os.path.join(ROOT, f"pair-{kind}-{dtype}-{strength}-b{block}-l{layers}{vocab}-v3"), build)
    return target, os.path.join(d, "drafter")
