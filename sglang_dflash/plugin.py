"""Entry point for SGLang's ``sglang.srt.plugins`` group (runs in every SGLang process).

Registers, lazily and idempotently:
- DFLASH -> our worker (``SGLANG_DFLASH_IMPL=builtin`` hands it back to SGLang's own worker);
- DFLASH on CPU (SGLang's argument check refuses non-GPU devices for its own worker);
- TARGET_VERIFY batches on the torch_native attention backend (it only knows EXTEND/DECODE);
- CPU stand-ins for the sgl_kernel functions SGLang imports, when the real ones cannot load;
- on SIGTERM, a bounded drain: new requests refused with 503 (srt/drain.py);
- a request check that refuses sampling features our verify does not reproduce exactly yet;
- CPU tensor parallelism (gloo groups without NCCL); a 400 for empty or out-of-vocabulary prompts;
- where a grammar ends inside a verified run, the same tokens and finish as plain decoding;
- on CPU, subprocesses forked rather than spawned (cpu/fork_start.py: a faster start), and each
  scheduler's forward on its rank's cores (cpu/cpu_threads.py);
- a DFLASH server's bf16 GEMMs, rotary embedding and RMSNorm on CPU through our kernels
  (cpu/cpu_linear.py), its Llama layer stack for decode and verify steps in one loop (cpu/llama_stack.py,
  chosen on SGLang's classes by srt/cpu_target.py).
"""

_registered = False


def register():
    global _registered
    if _registered:
        return
    _registered = True
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims
    from sglang_dflash.srt import hooks, sglang_patches

    install_cpu_shims()
    HookRegistry.register(
        "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker", hooks.create_worker, HookType.AROUND
    )
    HookRegistry.register("sglang.srt.arg_groups.speculative_hook._handle_dflash", hooks.handle_dflash, HookType.AROUND)
    HookRegistry.register(
        "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend",
        hooks.torch_native_forward_extend,
        HookType.AROUND,
    )
    HookRegistry.register(
        "sglang.srt.managers.scheduler.validate_dflash_request", hooks.validate_request, HookType.AROUND
    )
    HookRegistry.register(
        "sglang.srt.distributed.parallel_state.init_model_parallel_group",
        sglang_patches.init_model_parallel_group,
        HookType.AROUND,
    )
    HookRegistry.register(
        "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController._add_speculative",
        hooks.add_dflash_state,
        HookType.AROUND,
    )
    HookRegistry.register(
        "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
        "._accept_grammar_tokens",
        hooks.accept_grammar_tokens,
        HookType.AROUND,
    )
    HookRegistry.register(
        "sglang.srt.managers.schedule_batch.Req.update_finish_state", hooks.update_finish_state, HookType.AROUND
    )
    from sglang_dflash.cpu import cpu_linear, cpu_threads, fork_start, packed_weights
    from sglang_dflash.srt import cpu_target

    HookRegistry.register(
        "sglang.srt.distributed.bootstrap._init_cpu_threads_env", cpu_threads.init_cpu_threads_env, HookType.AROUND
    )

    HookRegistry.register(
        "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply", cpu_linear.linear_apply, HookType.AROUND
    )
    HookRegistry.register(
        "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head",
        cpu_target.compute_lm_head,
        HookType.AROUND,
    )
    HookRegistry.register(
        "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.forward_native",
        cpu_linear.rope_forward,
        HookType.AROUND,
    )

    HookRegistry.register(
        "sglang.srt.layers.layernorm.RMSNorm.forward_native", cpu_linear.rms_norm_forward, HookType.AROUND
    )
    HookRegistry.register("sglang.srt.models.llama.LlamaModel.forward", cpu_target.llama_forward, HookType.AROUND)
    updater = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager."
    for source in ("disk", "distributed", "tensor", "ipc"):  # packed copies follow every weight update
        HookRegistry.register(updater + "update_weights_from_" + source, packed_weights.repack, HookType.AROUND)
    HookRegistry.register(
        "sglang.srt.entrypoints.engine._set_envs_and_config", fork_start.set_envs_and_config, HookType.AROUND
    )
    fork_start.use_fork()
    from sglang_dflash import env

    if env.DEBUG_STEER.get() is not None or env.DEBUG_BROKEN_RULE.get():  # test switches only
        from sglang_dflash.testing.switches import register as register_test_switches

        register_test_switches(HookRegistry, HookType)
    HookRegistry.register(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        sglang_patches.reject_bad_prompt,
        HookType.BEFORE,
    )
    from sglang_dflash.srt import drain

    HookRegistry.register(  # SIGTERM: refuse new requests (503), bound the drain (SGLANG_DFLASH_DRAIN_S)
        "sglang.srt.entrypoints.http_server._setup_and_run_http_server", drain.setup_http_server, HookType.BEFORE
    )
    HookRegistry.register(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog",
        drain.sigterm_watchdog,
        HookType.AROUND,
    )
