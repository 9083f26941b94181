"""A short soak (the full one is `python bench/soak.py`, 600 requests): mixed prompt lengths up to
the context limit, max_new_tokens 1..512, greedy + sampled, streaming clients that hang up, API
aborts, and a KV pool small enough to queue. Nothing crashes, hangs, leaks or changes a token."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

pytestmark = pytest.mark.slow  # the slow tier: `make test-slow`, run by CI after `make test`


@pytest.mark.server
def test_short_soak(pair):
    from sglang_dflash.testing.pairs import MIXED
    from soak import soak

    target, drafter = pair("llama", "float32", MIXED["llama"])
    fig = soak(target, drafter, 120, 32)
    print(fig)
    assert fig["errors"] == {} and fig["error_count"] == 0, fig["errors"]  # incl. abort/disconnect paths
    assert fig["healthy"] and not fig["leak_reported"]
    assert fig["completed"] + fig["aborted"] + fig["disconnected"] == 120
    assert fig["aborted"] >= 5 and fig["disconnected"] >= 5 and fig["greedy_checked"] >= 30
    assert fig["greedy_mismatched"] == []
    assert fig["used_tokens_after_flush"] == 0 and fig["running_after"] == 0
    assert fig["rss_growth_mb"] < 200
