"""Reading a drafter's config.json fields: the error every bad field raises, and where a field lives
(z-lab checkpoints nest DFlash's own fields in `dflash_config`; a top-level field is read too)."""

from __future__ import annotations

from typing import Any


class DrafterConfigError(ValueError):
    """A drafter checkpoint that cannot serve with this target. The message names the field."""


def dflash_field(cfg: dict, key: str, default: Any = None) -> Any:
    dflash = cfg.get("dflash_config") or {}
    return dflash.get(key, cfg.get(key, default))
