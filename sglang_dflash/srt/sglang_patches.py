"""Fixes for SGLang 0.5.23 defects that DFLASH serving runs into (registered by plugin.py)."""


def init_model_parallel_group(original, group_ranks, local_rank, backend, *args, **kwargs):
    # SGLang 0.5.23 builds NCCL communicators for every non-NPU/XPU group, so tensor parallelism
    # cannot start on CPU (gloo): keep those groups on gloo alone.
    if backend == "gloo" and not args:
        kwargs.setdefault("use_pynccl", False)
        kwargs.setdefault("use_custom_allreduce", False)
    return original(group_ranks, local_rank, backend, *args, **kwargs)


def reject_bad_prompt(self, obj, input_ids, *args, **kwargs):
    # An empty prompt (a 0-token forward) or a token id outside the vocabulary (an embedding index
    # error) kills the scheduler in SGLang 0.5.23, with or without speculation: refuse with a 400.
    sp = getattr(obj, "sampling_params", None)
    spec = str(getattr(getattr(self, "server_args", None), "speculative_algorithm", None) or "")
    if spec.upper() == "DFLASH" and isinstance(sp, dict) and sp.get("max_new_tokens") == 0:
        raise ValueError("max_new_tokens is 0: a DFLASH server generates at least one token; send max_new_tokens >= 1")
    if input_ids is None or getattr(obj, "input_embeds", None) is not None:
        return
    if len(input_ids) == 0:
        raise ValueError("The prompt is empty: send at least one token (text or input_ids).")
    vocab = getattr(getattr(self, "model_config", None), "vocab_size", None)
    if vocab and (min(input_ids) < 0 or max(input_ids) >= vocab):
        bad = next(t for t in input_ids if t < 0 or t >= vocab)
        raise ValueError(f"input_ids contains token id {bad}, outside the vocabulary [0, {vocab}).")
