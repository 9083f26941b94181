"""Shared fixtures: tiny models are generated once per session (cached on disk across sessions)."""

import pytest

from sglang_dflash.testing.pairs import ROOT, pair as build_pair


def pytest_configure(config):
    config.addinivalue_line("markers", "server: starts a real SGLang server (slow)")
    config.addinivalue_line(
        "markers", "slow: the slow tier (`make test-slow`, run by CI after `make test`): scale-out, soak"
    )


@pytest.fixture(scope="session")
def pair():
    return build_pair


@pytest.fixture(scope="session")
def context_pair():
    """(target, drafter): a tiny target whose greedy text loops, and a drafter trained on it whose
    drafts depend on the context (built once, about a minute on 2 cores; cached under ROOT)."""
    from sglang_dflash.testing.context_drafter import make_context_pair

    return make_context_pair(ROOT)
