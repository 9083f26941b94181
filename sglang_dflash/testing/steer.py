"""Debug: steer a target after SGLang loads it (SGLANG_DFLASH_DEBUG_STEER=strength).

The in-process form of testing/tiny_drafter.steer_target, for targets whose weights never exist
as files (`--load-format dummy`: the GPU e2e check's Qwen3-8B-shaped target). With the steered
tiny drafter (which always proposes STEER_TOKEN) it gives a controlled acceptance: without the
switch tau ~ 1 (random weights agree with nothing), with a large strength every draft is accepted
(tau = the verify width), so a throughput row measures a worker at both ends of acceptance.
Every arm of a comparison (plain, ours, SGLang's built-in) loads the same steered target.
"""

from __future__ import annotations

import torch

from sglang_dflash.testing.tiny_drafter import wire_steering


def steer_module(model: torch.nn.Module, strength: float, vocab_size: int) -> None:
    """In place on a Llama/Qwen-style causal LM (HF or SGLang parameter names, one TP rank)."""
    params = dict(model.named_parameters(remove_duplicate=False))  # a tied head keeps its own name
    need = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
    missing = [n for n in need if n not in params]
    if missing:
        raise ValueError(f"SGLANG_DFLASH_DEBUG_STEER: the target has no {missing} (Llama/Qwen layout expected)")
    embed, head = params["model.embed_tokens.weight"], params["lm_head.weight"]
    if head.data_ptr() == embed.data_ptr():
        raise ValueError("SGLANG_DFLASH_DEBUG_STEER needs an untied LM head (tie_word_embeddings: false)")
    if head.shape[0] < vocab_size:
        raise ValueError("SGLANG_DFLASH_DEBUG_STEER: the LM head is split across TP ranks; steer with --tp 1")
    wire_steering(params, head, strength)


def steer_after_load(result, runner):
    """AFTER hook on ModelRunner.load_model: the target (not a draft model SGLang's own worker loads)."""
    from sglang_dflash import env

    if not runner.is_draft_worker:
        steer_module(runner.model, env.DEBUG_STEER.get(), runner.model_config.vocab_size)
    return result
