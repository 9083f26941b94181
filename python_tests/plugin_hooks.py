"""Test helper: apply one of the plugin's hooks to SGLang as plugin.register() would, alone."""

import pytest


def apply_plugin_hook(monkeypatch: pytest.MonkeyPatch, hook) -> str:
    """Run plugin.register() recording (not applying) its registrations, then register and apply only
    `hook` on the target the plugin gives it. Returns that target. Undoes the monkeypatch."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_dflash import plugin
    from sglang_dflash.cpu import fork_start

    seen = []
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(fork_start, "use_fork", lambda: None)
    monkeypatch.setattr(HookRegistry, "register", lambda target, h, *a, **kw: seen.append((target, h)))
    plugin.register()
    monkeypatch.undo()
    target = next(t for t, h in seen if h is hook)
    HookRegistry.register(target, hook, HookType.AROUND)
    HookRegistry.apply_hooks()
    return target
