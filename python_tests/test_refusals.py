"""Modes our DFLASH worker does not support are refused at start-up, before the model loads, with a
message naming DFLASH, the flag and the fix (srt/hooks.py handle_dflash): through the real server."""

import pytest

from sglang_dflash.testing.servers import run_failing


@pytest.mark.server
def test_hierarchical_cache_is_refused_at_startup(pair):
    target, drafter = pair("llama", "float32", None)
    code, out = run_failing(target, drafter, extra=["--enable-hierarchical-cache"], timeout=180)
    assert code != 0, out[-3000:]
    assert "DFLASH (sglang_dflash) does not support --enable-hierarchical-cache" in out, out[-3000:]
    assert "remove --enable-hierarchical-cache" in out, out[-3000:]
