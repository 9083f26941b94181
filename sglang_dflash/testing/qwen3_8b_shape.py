"""A Qwen3-8B-shaped target config (weights loaded with --load-format dummy) and a random 5-layer
steered drafter for it (always proposes STEER_TOKEN): the GPU end-to-end check's models
(bench/checks/e2e_check.py). Its acceptance is controlled by SGLANG_DFLASH_DEBUG_STEER (testing/steer.py):
unset, tau ~ 1; set, every draft is accepted. Nothing is downloaded."""

from __future__ import annotations

import json
import os

from sglang_dflash.folder_cache import build_once
from sglang_dflash.testing.tiny_drafter import make_tiny_drafter
from sglang_dflash.testing.tiny_models import make_tokenizer

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "attention_bias": False,
}


def dummy_pair(root: str) -> tuple[str, str]:
    def build(tmp: str) -> None:
        target = os.path.join(tmp, "target")
        os.makedirs(target)
        with open(os.path.join(target, "config.json"), "w") as f:
            json.dump(QWEN3_8B, f, indent=1)
        make_tokenizer(target)
        make_tiny_drafter(
            os.path.join(tmp, "drafter"),
            target,
            block_size=16,
            num_layers=5,
            target_layer_ids=[1, 9, 17, 25, 33],
            steer=True,
        )

    build_once(root, build)
    return os.path.join(root, "target"), os.path.join(root, "drafter")
