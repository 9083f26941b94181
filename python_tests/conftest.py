"""Shared fixtures: tiny models are generated once per session (cached on disk across sessions)."""
import os

import pytest

from sglang_dflash.testing.tiny_drafter import make_tiny_drafter, steer_target
from sglang_dflash.testing.tiny_models import tiny_model_cache

ROOT = os.environ.get("SGLANG_DFLASH_TEST_CACHE", "/tmp/sglang_dflash_test_models")

# Steering strength for a target that proposes the steer token only part of the time (so
# acceptance lengths vary); measured per architecture on the seed-0 tiny models.
MIXED = {"llama": 230.0, "qwen3": 230.0}
FORCED = 2000.0


def pytest_configure(config):
    config.addinivalue_line("markers", "server: starts a real SGLang server (slow)")


def _pair(kind: str, dtype: str, strength: float | None, block: int = 16, layers: int = 2) -> tuple[str, str]:
    """(target, drafter) paths. strength None -> the unmodified random target and a random drafter."""
    name = f"pair-{kind}-{dtype}-{strength}-b{block}-l{layers}-v2"
    d = os.path.join(ROOT, name)
    target, drafter = os.path.join(d, "target"), os.path.join(d, "drafter")
    if not os.path.exists(os.path.join(d, ".complete")):
        base = str(tiny_model_cache(kind, dtype))
        if strength is None:
            target = base
        else:
            steer_target(base, target, strength)
        make_tiny_drafter(drafter, target, block_size=block, num_layers=layers, steer=strength is not None)
        with open(os.path.join(d, ".complete"), "w") as f:
            f.write(target)
    with open(os.path.join(d, ".complete")) as f:
        return f.read().strip(), drafter


@pytest.fixture(scope="session")
def pair():
    return _pair


@pytest.fixture(scope="session")
def context_pair():
    """(target, drafter): a tiny target whose greedy text loops, and a drafter trained on it whose
    drafts depend on the context (built once, about a minute on 2 cores; cached under ROOT)."""
    from sglang_dflash.testing.context_drafter import make_context_pair

    return make_context_pair(ROOT)
