"""What training reads from the target's folder: its config as a drafter config, its mask token, its
frozen embedding / LM head and final norm tensors."""

from __future__ import annotations

import glob
import os

import torch


def drafter_config_dict(
    target_cfg: dict, num_layers: int, block_size: int, layer_ids: list[int], mask_token_id: int
) -> dict:
    """A z-lab style config.json for a drafter shaped like the target's layers."""
    t = target_cfg
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": t["hidden_size"],
        "num_hidden_layers": num_layers,
        "num_attention_heads": t["num_attention_heads"],
        "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"],
        "intermediate_size": t["intermediate_size"],
        "vocab_size": t["vocab_size"],
        "rms_norm_eps": 1e-6,
        "rope_theta": t.get("rope_theta", 10000.0),
        "hidden_act": "silu",
        "max_position_embeddings": t.get("max_position_embeddings", 8192),
        "tie_word_embeddings": False,
        "block_size": block_size,
        "num_target_layers": t["num_hidden_layers"],
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": layer_ids},
        "torch_dtype": "bfloat16",
    }


MASK_TOKEN = "<empty_output>"  # an unused special token of the SmolLM2 tokenizer (id 16)


def mask_token_id_for(model: str) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tid = tok.convert_tokens_to_ids(MASK_TOKEN)
    return int(tid) if isinstance(tid, int) and tid != tok.unk_token_id else len(tok) - 1


def load_target_tensor(model: str, names=("lm_head.weight", "model.embed_tokens.weight")) -> torch.Tensor:
    """The first of `names` found in the target's safetensors, as stored (bf16)."""
    from safetensors import safe_open

    for f in sorted(glob.glob(os.path.join(model, "*.safetensors"))):
        with safe_open(f, "pt") as st:
            for k in names:
                if k in st.keys():
                    return st.get_tensor(k)
    raise FileNotFoundError(f"none of {names} in {model}")


def load_embedding(model: str) -> torch.Tensor:
    """The target's (tied) embedding = LM head weight [V, H], frozen (bf16)."""
    return load_target_tensor(model)
