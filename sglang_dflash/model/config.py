"""Drafter checkpoint config: parsing, the layer-id convention, and start-up validation.

One source of truth for every fact about a DFlash checkpoint's config.json. Plain Python (no
torch, no sglang) so it is unit-testable and importable anywhere.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

# DrafterConfigError and the DFlash 2 names are imported from here by callers too
from sglang_dflash.model.config_fields import DrafterConfigError, dflash_field
from sglang_dflash.model.dflash2_config import DFLASH2_FIELDS, SELECTOR_WALKS, DFlash2Config, parse_dflash2  # noqa: F401


def default_target_layer_ids(num_target_layers: int, num_context_layers: int) -> list[int]:
    """z-lab default when `target_layer_ids` is absent (NOTES section 1).

    Ids follow the z-lab convention: id means "the output of decoder layer id"
    (HF `hidden_states[id + 1]`). One id -> the middle layer; K ids -> evenly spaced in [1, L-3].
    """
    if num_context_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(start + round(i * span / (num_context_layers - 1))) for i in range(num_context_layers)]


def hf_hidden_state_index(layer_id: int) -> int:
    """The z-lab layer id -> index into HF `output_hidden_states` (index 0 is the embedding)."""
    return layer_id + 1


@dataclass
class DrafterConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    mask_token_id: Optional[int]
    mask_token: Optional[str]
    target_layer_ids: list[int]
    # [num_layers]: layer i's sliding window W (its queries at p see context keys in (p - W, p]), None: full
    layer_windows: list[Optional[int]] = field(default_factory=list)
    dflash2: Optional["DFlash2Config"] = None
    draft_vocab_size: Optional[int] = None  # reduced draft vocabulary (draft_vocab.py); None: the target's

    @property
    def num_context_layers(self) -> int:
        return len(self.target_layer_ids)


LAYER_TYPES = ("full_attention", "sliding_attention")


def parse_layer_windows(cfg: dict, num_layers: int) -> list[Optional[int]]:
    """Per-layer sliding window from `layer_types` + `sliding_window` (None: full attention).

    HF Qwen3 config semantics: `use_sliding_window: false` switches every window off (HF nulls the
    window). Absent counts as on: HF writes the flag into every config it saves, so a config without
    it was written by hand and its sliding layers are meant. Without `layer_types`, HF's rule: the
    layers from `max_window_layers` (28) on slide when use_sliding_window is true.
    """
    enabled = cfg.get("use_sliding_window") is not False
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is None:  # derived as HF does
        on = cfg.get("use_sliding_window") is True and window is not None
        slide_from = cfg.get("max_window_layers", 28) if on else num_layers
        types = ["sliding_attention" if i >= slide_from else "full_attention" for i in range(num_layers)]
    if not isinstance(types, list) or len(types) != num_layers or not all(t in LAYER_TYPES for t in types):
        raise DrafterConfigError(
            f"drafter config layer_types must name one of {LAYER_TYPES} for each of the "
            f"{num_layers} layers, got {types!r}"
        )
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if not enabled or not sliding:
        return [None] * num_layers
    if window is None:
        raise DrafterConfigError(
            f"drafter config layer_types marks layers {sliding} 'sliding_attention' but "
            "'sliding_window' is not set; set sliding_window to the window the drafter "
            "was trained with"
        )
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise DrafterConfigError(f"drafter config 'sliding_window' must be an int >= 1, got {window!r}")
    return [window if t == "sliding_attention" else None for t in types]


def _need_int(cfg: dict, key: str, minimum: int = 1) -> int:
    val = cfg.get(key)
    if not isinstance(val, int) or isinstance(val, bool) or val < minimum:
        raise DrafterConfigError(
            f"drafter config field '{key}' must be an int >= {minimum}, got {val!r}; "
            f"fix config.json of the drafter checkpoint"
        )
    return val


def read_block_size(path: str) -> int:
    """The drafter's trained block size (the server's default block size)."""
    with open(os.path.join(path, "config.json")) as f:
        block = dflash_field(json.load(f), "block_size")
    if not isinstance(block, int) or block < 2:
        raise DrafterConfigError(
            f"drafter config 'block_size' must be an int >= 2, got {block!r} (in {path}/config.json)"
        )
    return block


MAX_BLOCK_SIZE = 64  # the largest block B a server runs (B draft rows per request and step)
BLOCK_FLAGS = "--speculative-dflash-block-size (or --speculative-num-draft-tokens)"


def resolve_block_size(flag_value: Optional[int], drafter: "str | DrafterConfig") -> int:
    """The block size a server runs: the flag when given, else the drafter's trained block_size.

    drafter: the checkpoint folder or its parsed config. Raises naming the flag or the field.
    """
    if flag_value is not None:
        block = int(flag_value)
        if not 2 <= block <= MAX_BLOCK_SIZE:
            raise ValueError(f"{BLOCK_FLAGS} = {block} must be in [2, {MAX_BLOCK_SIZE}]")
        return block
    block = drafter.block_size if isinstance(drafter, DrafterConfig) else read_block_size(drafter)
    if block > MAX_BLOCK_SIZE:
        raise DrafterConfigError(
            f"drafter config block_size={block} is larger than a server runs "
            f"({MAX_BLOCK_SIZE}); pass {BLOCK_FLAGS} N, 2 <= N <= {MAX_BLOCK_SIZE}"
        )
    return block


def load_drafter_config(path: str, target_num_layers: int) -> DrafterConfig:
    """Read `path`/config.json (a z-lab DFlash checkpoint) and resolve every field."""
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise DrafterConfigError(
            f"drafter checkpoint has no config.json: {cfg_file!r}; "
            "--speculative-draft-model-path must point at a DFlash checkpoint folder"
        )
    with open(cfg_file) as f:
        cfg = json.load(f)
    return parse_drafter_config(cfg, target_num_layers)


def parse_drafter_config(cfg: dict, target_num_layers: int) -> DrafterConfig:
    hidden = _need_int(cfg, "hidden_size")
    num_layers = _need_int(cfg, "num_hidden_layers")
    heads = _need_int(cfg, "num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    block_size = dflash_field(cfg, "block_size")
    if block_size is None:
        raise DrafterConfigError(
            "drafter config has no 'block_size' (top level or dflash_config); "
            "add the block size the drafter was trained with (e.g. 16)"
        )
    if not isinstance(block_size, int) or block_size < 2:
        raise DrafterConfigError(f"drafter config 'block_size' must be an int >= 2, got {block_size!r}")
    mask_token_id = dflash_field(cfg, "mask_token_id")
    mask_token = dflash_field(cfg, "mask_token")
    if mask_token_id is None and mask_token is None:
        raise DrafterConfigError(
            "drafter config has no mask token: set dflash_config.mask_token_id (or the older 'mask_token' string)"
        )
    ids = dflash_field(cfg, "target_layer_ids")
    if ids is None:
        ids = default_target_layer_ids(target_num_layers, num_layers)
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise DrafterConfigError(f"dflash_config.target_layer_ids must be a non-empty list of ints, got {ids!r}")
    if len(set(ids)) != len(ids):
        raise DrafterConfigError(
            f"dflash_config.target_layer_ids {ids} repeats a layer; each layer's features can be captured once"
        )
    for i in ids:
        if not 0 <= i < target_num_layers:
            raise DrafterConfigError(
                f"dflash_config.target_layer_ids has {i}, out of range for a target with "
                f"{target_num_layers} layers (valid: 0..{target_num_layers - 1})"
            )
    # transformers 5 writes rope_parameters (z-lab's newer drafters too); older configs rope_scaling
    rope_scaling = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_theta = cfg.get("rope_theta", rope_scaling.get("rope_theta", 10000.0))
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type", "default")) != "default":
        raise DrafterConfigError(
            f"drafter config rope_scaling {rope_scaling!r} is not supported; only default RoPE drafters are"
        )
    return DrafterConfig(
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_need_int(cfg, "intermediate_size"),
        vocab_size=_need_int(cfg, "vocab_size"),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_theta),
        block_size=block_size,
        mask_token_id=mask_token_id,
        mask_token=mask_token,
        target_layer_ids=list(ids),
        layer_windows=parse_layer_windows(cfg, num_layers),
        dflash2=parse_dflash2(cfg, hidden),
        draft_vocab_size=_need_int(cfg, "draft_vocab_size") if cfg.get("draft_vocab_size") is not None else None,
    )


def check_against_target(cfg: DrafterConfig, *, hidden_size: int, vocab_size: int) -> None:
    """Start-up checks that need the target's shape. Raises DrafterConfigError naming the field."""
    if cfg.hidden_size != hidden_size:
        raise DrafterConfigError(
            f"drafter hidden_size={cfg.hidden_size} differs from the target's hidden_size={hidden_size}; "
            "a DFlash drafter must be trained for this target"
        )
    if cfg.num_heads * cfg.head_dim <= 0 or cfg.num_heads % cfg.num_kv_heads != 0:
        raise DrafterConfigError(
            f"drafter head layout num_attention_heads={cfg.num_heads} num_key_value_heads="
            f"{cfg.num_kv_heads} is invalid (heads must be a multiple of kv heads)"
        )
    if cfg.vocab_size != vocab_size:
        raise DrafterConfigError(
            f"drafter vocab_size={cfg.vocab_size} differs from the target's vocab_size={vocab_size}"
        )
    scored = cfg.draft_vocab_size or vocab_size  # tokens the drafter scores
    if scored > vocab_size:
        raise DrafterConfigError(f"drafter draft_vocab_size={scored} exceeds the target's vocab_size={vocab_size}")
    if cfg.dflash2 is not None and cfg.dflash2.selector_top_k > scored:
        raise DrafterConfigError(
            f"dflash_config.selector_top_k={cfg.dflash2.selector_top_k} exceeds the drafter's vocabulary ({scored})"
        )
    if cfg.mask_token_id is not None and not 0 <= cfg.mask_token_id < vocab_size:
        raise DrafterConfigError(
            f"dflash_config.mask_token_id={cfg.mask_token_id} is outside the target vocabulary (size {vocab_size})"
        )
