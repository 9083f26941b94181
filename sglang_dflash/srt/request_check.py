"""Per-request features our verify path does not reproduce exactly. Such a request is refused
with a clear message (the scheduler aborts it, everyone else keeps being served) rather than
served with a silently different distribution. Penalties, min_new_tokens and logit_bias are served
exactly (penalties.py), and so are grammars (json_schema, regex, ebnf, structural_tag:
grammar_mask.py). Watermarks and custom logit processors are not: SGLang applies them inside its
sampler to one row per request, with state our multi-row verify cannot replay exactly."""

from __future__ import annotations

from typing import Optional

_UNSUPPORTED = (("watermark", lambda v: bool(v)),)


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
