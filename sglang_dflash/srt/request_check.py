"""Per-request features our verify path does not reproduce exactly. Such a request is refused
with a clear message (the scheduler aborts it, everyone else keeps being served) rather than
served with a silently different distribution. Penalties, min_new_tokens and logit_bias are served
exactly (penalties.py), and so are grammars (json_schema, regex, ebnf, structural_tag:
grammar_mask.py). Watermarks and custom logit processors are not: SGLang applies them inside its
sampler to one row per request, with state our multi-row verify cannot replay exactly.

A request may cap the verify width of the steps it is in: `custom_params: {"dflash_max_width": N}`
(N >= 1; 1 = plain decoding while it runs). Capping is exact (a narrower step commits what plain
decoding would), and it caps its whole batch (one width a step); a bad value is refused by name."""

from __future__ import annotations

from typing import Optional

_UNSUPPORTED = (("watermark", lambda v: bool(v)),)
MAX_WIDTH = "dflash_max_width"  # the custom_params key


def max_width(sampling_params) -> Optional[int]:
    """The request's cap on the verify width (custom_params["dflash_max_width"]), None: no cap."""
    params = getattr(sampling_params, "custom_params", None)
    return params.get(MAX_WIDTH) if isinstance(params, dict) else None


def width_cap_error(sampling_params) -> Optional[str]:
    """None when the request's width cap is absent or valid, else the message to return."""
    cap = max_width(sampling_params)
    if cap is None or (isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1):
        return None
    return (
        f"custom_params.{MAX_WIDTH}={cap!r}: expected an integer >= 1 (the most rows a verify step of this "
        "request may verify; 1 = no speculation), or leave it out"
    )


def unsupported_reason(sampling_params, custom_logit_processor=None) -> Optional[str]:
    """None when DFLASH (sglang_dflash) serves this request exactly, else the message to return."""
    bad = [name for name, is_set in _UNSUPPORTED if is_set(getattr(sampling_params, name, None))]
    if custom_logit_processor:
        bad.append("custom_logit_processor")
    if not bad:
        return None
    return (
        f"DFLASH speculative decoding (sglang_dflash) does not support {', '.join(bad)} yet; "
        "drop the field(s) or send the request to a server without speculative decoding"
    )
