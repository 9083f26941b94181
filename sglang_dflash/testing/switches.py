"""The test switches a server honours (env.py: SGLANG_DFLASH_DEBUG_STEER, SGLANG_DFLASH_DEBUG_BROKEN_RULE),
registered from here: plugin.py imports this module only when one of them is set, so serving code
never imports test helpers otherwise."""

from __future__ import annotations


def register(registry, hook_type) -> None:
    """registry, hook_type: SGLang's HookRegistry and HookType (passed in: no sglang import here)."""
    from sglang_dflash import env

    if env.DEBUG_BROKEN_RULE.get():
        from sglang_dflash.testing.broken_rules import install

        install(env.DEBUG_BROKEN_RULE.get())
    if env.DEBUG_STEER.get() is not None:
        from sglang_dflash.testing.steer import steer_after_load

        registry.register(
            "sglang.srt.model_executor.model_runner.ModelRunner.load_model", steer_after_load, hook_type.AFTER
        )
