"""The hooks that put our DFLASH worker behind SGLang (registered by plugin.py).

Each imports its sglang / worker dependencies when it first runs, so registering them is cheap in
every SGLang process.
"""

import logging
import os
import weakref

from sglang_dflash import env

logger = logging.getLogger("sglang_dflash")


def use_ours() -> bool:
    return env.IMPL.get() == "ours"


def create_worker(original, self, server_args):
    if self.is_dflash() and use_ours():
        from sglang_dflash.srt.worker import DFlashWorker

        return DFlashWorker
    return original(self, server_args)


def handle_dflash(original, server_args):
    """Resolve DFLASH server arguments for our worker (SGLang's own resolver refuses CPU)."""
    if not use_ours():
        return original(server_args)
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    from sglang_dflash.model.config import resolve_block_size

    cfg = resolving_view(server_args)
    if cfg.pp_size != 1:
        raise ValueError("DFLASH (sglang_dflash) supports --pp-size 1 only")
    refuse_unsupported_modes(cfg)
    if cfg.speculative_draft_model_path is None:
        raise ValueError("DFLASH needs --speculative-draft-model-path (a DFlash drafter checkpoint)")
    if getattr(cfg, "grammar_backend", None) == "outlines":  # its grammars cannot roll back
        raise ValueError(
            "DFLASH (sglang_dflash) masks verify rows along the draft chain and needs a grammar backend "
            "with rollback: use --grammar-backend xgrammar (the default) or llguidance, not outlines"
        )
    flag = cfg.speculative_dflash_block_size or cfg.speculative_num_draft_tokens
    block = resolve_block_size(flag, cfg.speculative_draft_model_path)
    decisions = dict(
        speculative_num_steps=1,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=block,
        # Our worker runs each step synchronously: no overlapped scheduling.
        disable_overlap_schedule=True,
    )
    if cfg.max_running_requests is None:
        decisions["max_running_requests"] = 48
    decisions.update(cpu_defaults(cfg.device))
    declare_resolution(server_args, "sglang_dflash", **decisions)


def refuse_unsupported_modes(cfg) -> None:
    """Modes whose KV or batches bypass our worker's drafter context, refused before the model loads.
    SGLang has already folded --dp-size N --enable-dp-attention into attn_dp_size = N (and cleared
    enable_dp_attention), so attention DP is read from the width, as SGLang's own predicate does."""
    from sglang.srt.runtime_context import attn_dp_enabled_of

    mode = getattr(cfg, "disaggregation_mode", "null")
    dp_fix = "remove --enable-dp-attention / --attn-dp-size (replicas: --dp-size N alone)"
    for on, flag, why, fix in (
        (
            cfg.enable_hierarchical_cache,
            "--enable-hierarchical-cache",
            "its host-tier KV carries no drafter context",
            "remove --enable-hierarchical-cache",
        ),
        (
            mode not in (None, "null"),
            f"--disaggregation-mode {mode}",
            "the prefill side writes no drafter context",
            "remove --disaggregation-mode",
        ),
        (
            attn_dp_enabled_of(cfg),
            f"DP attention (--enable-dp-attention / --attn-dp-size {cfg.attn_dp_size})",
            "the worker drafts one attention group only",
            dp_fix,
        ),
    ):
        if on:
            raise ValueError(f"DFLASH (sglang_dflash) does not support {flag} ({why}): {fix}")


def cpu_defaults(device) -> dict:
    """A CPU DFLASH server shares its host however it was launched: its scheduler sleeps when idle
    (it otherwise polls its sockets nonstop, a whole core), and its OpenMP threads wait the way
    cpu_serving.py sets (our launcher sets them before any process starts; under a plain
    sglang.launch_server they reach the schedulers, spawned from this process). A user's own
    environment wins."""
    from sglang_dflash.cpu_serving import OMP_WAIT, cuda_visible

    if (device or ("cuda" if cuda_visible() else "cpu")) != "cpu":
        return {}
    for k, v in OMP_WAIT.items():
        os.environ.setdefault(k, v)
    return {"sleep_on_idle": True}


def torch_native_forward_extend(original, self, q, k, v, layer, forward_batch, save_kv_cache=True):
    if forward_batch.forward_mode.is_target_verify():
        from sglang_dflash.srt.verify_backend import torch_native_verify

        return torch_native_verify(self, q, k, v, layer, forward_batch, save_kv_cache)
    return original(self, q, k, v, layer, forward_batch, save_kv_cache)


def validate_request(original, req, enable_overlap):
    if use_ours():
        from sglang_dflash.srt.request_check import unsupported_reason, width_cap_error

        reason = unsupported_reason(req.sampling_params, getattr(req, "custom_logit_processor", None))
        reason = reason or width_cap_error(req.sampling_params)
        if reason:
            # The refused request still passes through one prefill on its way out (SGLang finishes
            # aborted requests in a batch): drop its processor so it never runs there.
            if getattr(req, "custom_logit_processor", None):
                req.custom_logit_processor = None
            return reason
    return original(req, enable_overlap)


def add_dflash_state(original, self, state):
    """/server_info: internal_states[i]["dflash"] = our worker's live counters (draft failures...)."""
    original(self, state)
    stats = getattr(self.scheduler.draft_worker, "stats", None)
    if use_ours() and callable(stats):
        state["dflash"] = stats()


# Requests whose last run ended on their grammar's terminating token (ours, not an attribute on
# SGLang's Req; weak, so a request that finishes or aborts leaves nothing behind).
ENDED_ON_TERMINATION: weakref.WeakSet = weakref.WeakSet()


def accept_grammar_tokens(original, self, req, tokens):
    """Where a grammar ends, commit what plain decoding commits.

    Plain decoding appends a token, checks the finish, then advances the grammar; so after the token
    that terminates the grammar it still appends one more (unconstrained) token and finishes on it
    (visible with ignore_eos, or when the terminating token is not a stop token of the request).
    SGLang's speculative path advances the grammar over the whole run first and cuts the run at the
    terminating token. For our worker's runs: keep the token after the terminating one; and when the
    run ends on the terminating token, let this step's finish check not see the termination (the
    next step commits that one token and finishes on it, as plain decoding does)."""
    if isinstance(tokens, int) or not getattr(getattr(self, "draft_worker", None), "ends_grammar_like_plain", False):
        return original(self, req, tokens)
    if req.grammar.is_terminated():  # terminated by the last step's final token: one more, then finish
        return list(tokens[:1])
    kept = original(self, req, tokens)
    if req.to_finish is None and req.grammar.is_terminated():
        if len(kept) < len(tokens):
            kept.append(tokens[len(kept)])
        else:
            ENDED_ON_TERMINATION.add(req)
    return kept


def update_finish_state(original, self, new_accepted_len=1):
    """See accept_grammar_tokens: a run that ended on the grammar's terminating token does not finish
    on the termination in this step (every other finish rule still applies)."""
    if self not in ENDED_ON_TERMINATION:
        return original(self, new_accepted_len)
    ENDED_ON_TERMINATION.discard(self)
    grammar, self.grammar = self.grammar, None
    try:
        return original(self, new_accepted_len)
    finally:
        self.grammar = grammar
