"""Entry point for SGLang's ``sglang.srt.plugins`` group (runs in every SGLang process).

Registers, lazily and idempotently:
- DFLASH -> our worker (``SGLANG_DFLASH_IMPL=builtin`` hands it back to SGLang's own worker);
- DFLASH on CPU (SGLang's argument check refuses non-GPU devices for its own worker);
- TARGET_VERIFY batches on the torch_native attention backend (it only knows EXTEND/DECODE);
- CPU stand-ins for the sgl_kernel functions SGLang imports, when the real ones cannot load;
- a request check that refuses sampling features our verify does not reproduce exactly yet;
- CPU tensor parallelism (gloo groups without NCCL); a 400 for empty or out-of-vocabulary prompts.
"""
import logging

from sglang_dflash import env

logger = logging.getLogger("sglang_dflash")


def use_ours() -> bool:
    return env.IMPL.get() == "ours"


def _create_worker(original, self, server_args):
    if self.is_dflash() and use_ours():
        from sglang_dflash.worker import DFlashWorker

        return DFlashWorker
    return original(self, server_args)


def _handle_dflash(original, server_args):
    """Resolve DFLASH server arguments for our worker (SGLang's own resolver refuses CPU)."""
    if not use_ours():
        return original(server_args)
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    from sglang_dflash.config import resolve_block_size

    cfg = resolving_view(server_args)
    if cfg.pp_size != 1:
        raise ValueError("DFLASH (sglang_dflash) supports --pp-size 1 only")
    if cfg.speculative_draft_model_path is None:
        raise ValueError("DFLASH needs --speculative-draft-model-path (a DFlash drafter checkpoint)")
    flag = cfg.speculative_dflash_block_size or cfg.speculative_num_draft_tokens
    block = resolve_block_size(flag, cfg.speculative_draft_model_path)
    decisions = dict(speculative_num_steps=1, speculative_eagle_topk=1,
                     speculative_num_draft_tokens=block,
                     # Our worker runs each step synchronously: no overlapped scheduling.
                     disable_overlap_schedule=True)
    if cfg.max_running_requests is None:
        decisions["max_running_requests"] = 48
    declare_resolution(server_args, "sglang_dflash", **decisions)


def _torch_native_forward_extend(original, self, q, k, v, layer, forward_batch, save_kv_cache=True):
    if forward_batch.forward_mode.is_target_verify():
        from sglang_dflash.verify_backend import torch_native_verify

        return torch_native_verify(self, q, k, v, layer, forward_batch, save_kv_cache)
    return original(self, q, k, v, layer, forward_batch, save_kv_cache)


def _init_model_parallel_group(original, group_ranks, local_rank, backend, *args, **kwargs):
    # SGLang 0.5.23 builds NCCL communicators for every non-NPU/XPU group, so tensor parallelism
    # cannot start on CPU (gloo): keep those groups on gloo alone.
    if backend == "gloo" and not args:
        kwargs.setdefault("use_pynccl", False)
        kwargs.setdefault("use_custom_allreduce", False)
    return original(group_ranks, local_rank, backend, *args, **kwargs)


def _validate_request(original, req, enable_overlap):
    if use_ours():
        from sglang_dflash.request_check import unsupported_reason

        reason = unsupported_reason(req.sampling_params, getattr(req, "custom_logit_processor", None))
        if reason:
            return reason
    return original(req, enable_overlap)


def _add_dflash_state(original, self, state):
    """/server_info: internal_states[i]["dflash"] = our worker's live counters (draft failures...)."""
    original(self, state)
    stats = getattr(self.scheduler.draft_worker, "stats", None)
    if use_ours() and callable(stats):
        state["dflash"] = stats()


def _reject_bad_prompt(self, obj, input_ids, *args, **kwargs):
    # An empty prompt (a 0-token forward) or a token id outside the vocabulary (an embedding index
    # error) kills the scheduler in SGLang 0.5.23, with or without speculation: refuse with a 400.
    sp = getattr(obj, "sampling_params", None)
    spec = str(getattr(getattr(self, "server_args", None), "speculative_algorithm", None) or "")
    if spec.upper() == "DFLASH" and isinstance(sp, dict) and sp.get("max_new_tokens") == 0:
        raise ValueError("max_new_tokens is 0: a DFLASH server generates at least one token; "
                         "send max_new_tokens >= 1")
    if input_ids is None or getattr(obj, "input_embeds", None) is not None:
        return
    if len(input_ids) == 0:
        raise ValueError("The prompt is empty: send at least one token (text or input_ids).")
    vocab = getattr(getattr(self, "model_config", None), "vocab_size", None)
    if vocab and (min(input_ids) < 0 or max(input_ids) >= vocab):
        bad = next(t for t in input_ids if t < 0 or t >= vocab)
        raise ValueError(f"input_ids contains token id {bad}, outside the vocabulary [0, {vocab}).")


_registered = False


def register():
    global _registered
    if _registered:
        return
    _registered = True
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_dflash.cpu_shims import install_cpu_shims

    install_cpu_shims()
    HookRegistry.register("sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker",
                          _create_worker, HookType.AROUND)
    HookRegistry.register("sglang.srt.arg_groups.speculative_hook._handle_dflash",
                          _handle_dflash, HookType.AROUND)
    HookRegistry.register(
        "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend",
        _torch_native_forward_extend, HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.scheduler.validate_dflash_request", _validate_request,
                          HookType.AROUND)
    HookRegistry.register("sglang.srt.distributed.parallel_state.init_model_parallel_group",
                          _init_model_parallel_group, HookType.AROUND)
    HookRegistry.register(
        "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController._add_speculative",
        _add_dflash_state, HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
                          _reject_bad_prompt, HookType.BEFORE)
