"""Start-up resolution that needs the target's tokenizer (kept out of the pure config module)."""

from __future__ import annotations

from sglang_dflash.model.config import DrafterConfig, DrafterConfigError


def resolve_mask_token_id(cfg: DrafterConfig, tokenizer_path: str, vocab_size: int) -> int:
    """Checkpoints carry either dflash_config.mask_token_id or (older) a mask_token string."""
    if cfg.mask_token_id is not None:
        return int(cfg.mask_token_id)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    tid = tok.convert_tokens_to_ids(cfg.mask_token)
    if tid is None or (tok.unk_token_id is not None and tid == tok.unk_token_id) or not 0 <= tid < vocab_size:
        raise DrafterConfigError(
            f"drafter mask_token {cfg.mask_token!r} is not in the target vocabulary; set "
            "dflash_config.mask_token_id to a token id the target knows"
        )
    return int(tid)
