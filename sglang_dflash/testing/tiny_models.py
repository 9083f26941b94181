"""Tiny random HF checkpoints (Llama, Qwen3) with an offline tokenizer, for tests.

Everything is built locally: a byte-level BPE tokenizer trained on generated
text (no hub download) and a randomly initialised model whose weights are
scaled up so greedy decoding is not stuck on one token.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from sglang_dflash import env
from sglang_dflash.folder_cache import build_once

BOS, EOS, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [PAD, BOS, EOS]  # ids 0, 1, 2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
VOCAB_SIZE = 384

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Small common shape: hidden 64, 4 layers, 4 heads (2 KV), head_dim 16.
_SHAPE = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
)
# Std of every matrix after re-initialisation. At HF's default 0.02 the top-2 logits
# of this 64-wide random model are often ~1e-4 apart (fragile greedy ties) and greedy
# text tends to loop on a few tokens; at 0.5, 20 greedy tokens are 16-20 distinct ones.
_INIT_STD = 0.5

_WORDS = (
    "the a of to and in is it that for on with as was he she they we you at by this from "
    "or one had not but what all were when there can an your which their said if do will "
    "each about how up out them then many some so these would other into has more two "
    "time see way could people my than first water been call who its now find long down "
    "day did get come made may part over new sound take only little work know place year "
    "live me back give most very after thing our just name good sentence man think say"
).split()


def _corpus(seed: int = 0, n: int = 3000) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))).capitalize() + "." for _ in range(n)]


def make_tokenizer(path: str | os.PathLike) -> None:
    """Train a byte-level BPE (covers any UTF-8 input) and save it as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD_ID, BOS_ID, EOS_ID]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))


def _make(kind: str, path, dtype: str, seed: int) -> Path:
    import torch
    import transformers
    from transformers import GenerationConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if kind == "llama":
        config = transformers.LlamaConfig(**_SHAPE)
        model_cls = transformers.LlamaForCausalLM
    elif kind == "qwen3":
        config = transformers.Qwen3Config(**_SHAPE)
        model_cls = transformers.Qwen3ForCausalLM
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}")
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # matrices and embeddings; norms stay at 1
                p.normal_(0.0, _INIT_STD)
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    model.save_pretrained(str(path))
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID).save_pretrained(str(path))
    make_tokenizer(path)
    return path


def make_tiny_llama(path, dtype: str = "float32", seed: int = 0) -> Path:
    """Write a random LlamaForCausalLM (hidden 64, 4 layers) + tokenizer to ``path``."""
    return _make("llama", path, dtype, seed)


def make_tiny_qwen3(path, dtype: str = "float32", seed: int = 0) -> Path:
    """Write a random Qwen3ForCausalLM (same shape, with q/k norms) + tokenizer to ``path``."""
    return _make("qwen3", path, dtype, seed)


_MAKERS = {"llama": make_tiny_llama, "qwen3": make_tiny_qwen3}


def tiny_model_cache(kind: str = "llama", dtype: str = "float32", seed: int = 0) -> Path:
    """Path of a cached tiny checkpoint under $SGLANG_DFLASH_TEST_CACHE, built once (folder_cache)."""

    def build(tmp: str) -> dict:
        _MAKERS[kind](tmp, dtype=dtype, seed=seed)
        return {"kind": kind, "dtype": dtype, "seed": seed}

    return Path(build_once(os.path.join(env.TEST_CACHE.get(), f"tiny-{kind}-{dtype}-s{seed}"), build))
