"""The small drafter config dict the unit tests parse (hidden 32, 4/2 heads, vocab 50)."""


def tiny_cfg_dict(layers: int = 2, dflash: dict | None = None, **overrides) -> dict:
    """A valid DFlash drafter config.json as a dict; keyword arguments replace top-level fields."""
    cfg = {
        "hidden_size": 32,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "vocab_size": 50,
        "block_size": 4,
        "dflash_config": {"mask_token_id": 49, "target_layer_ids": [0, 2], **(dflash or {})},
    }
    cfg.update(overrides)
    return cfg
