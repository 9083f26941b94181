"""Modes our DFLASH worker does not support are refused at start-up, before the model loads, with a
message naming DFLASH, the flag and the fix (srt/hooks.py refuse_unsupported_modes): through the real
server, one at a time, each failing in seconds."""

import pytest

from sglang_dflash.testing.servers import run_failing

REFUSED = "DFLASH (sglang_dflash) does not support"


def refused(pair, extra):
    target, drafter = pair("llama", "float32", None)
    code, out = run_failing(target, drafter, extra=extra, timeout=180)
    assert code != 0, out[-3000:]
    assert "fired up and ready" not in out, out[-3000:]
    return out


@pytest.mark.server
def test_hierarchical_cache_is_refused_at_startup(pair):
    out = refused(pair, ["--enable-hierarchical-cache"])
    assert f"{REFUSED} --enable-hierarchical-cache" in out, out[-3000:]
    assert "remove --enable-hierarchical-cache" in out, out[-3000:]


@pytest.mark.server
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_pd_disaggregation_is_refused_at_startup(pair, mode):
    out = refused(pair, ["--disaggregation-mode", mode])
    assert f"{REFUSED} --disaggregation-mode {mode}" in out, out[-3000:]
    assert "remove --disaggregation-mode" in out, out[-3000:]


@pytest.mark.server
@pytest.mark.parametrize(
    "flags",
    [["--dp-size", "2", "--enable-dp-attention"], ["--attn-dp-size", "2"]],
    ids=["enable-dp-attention", "attn-dp-size"],
)
def test_dp_attention_is_refused_at_startup(pair, flags):
    # --tp-size 2: SGLang asserts tp_size % attn_dp_size == 0 (a bare AssertionError) before our check;
    # the deprecated --enable-dp-attention becomes --attn-dp-size N (alone, with --dp-size 1, it is a
    # no-op in SGLang and serves as usual)
    out = refused(pair, ["--tp-size", "2", *flags])
    assert f"{REFUSED} DP attention (--enable-dp-attention / --attn-dp-size 2)" in out, out[-3000:]
    assert "remove --enable-dp-attention / --attn-dp-size" in out, out[-3000:]
