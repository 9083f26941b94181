"""The house reads model -> pipeline -> srt: only srt/ (and the entry points) may import sglang, and
the plain-torch layers never reach up into the SGLang-facing one.

cpu/, the target's CPU backend, is a room beside them: srt/ and plugin.py import it; it imports only
env, kernels, cpu_serving and itself (never sglang, srt/, model/, pipeline/ or testing/), and
model/ and pipeline/ never import it (the drafter is handed its GEMM router)."""

import ast
import importlib
import pathlib
import pkgutil

import sglang_dflash

PKG = pathlib.Path(sglang_dflash.__file__).parent


def imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def imported_names(path: pathlib.Path) -> set[str]:
    """imported_modules plus each `from X import y` as X.y (a submodule or a name of X)."""
    names = imported_modules(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_model_and_pipeline_are_plain_torch():
    for layer in ("model", "pipeline"):
        for path in sorted((PKG / layer).glob("*.py")):
            bad = {
                m
                for m in imported_names(path)
                if m == "sglang"
                or m.startswith("sglang.")
                or m.startswith("sglang_dflash.srt")
                or m.startswith("sglang_dflash.testing")
                or m.startswith("sglang_dflash.cpu.")
                or m == "sglang_dflash.cpu"
            }
            assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"


def test_model_does_not_import_pipeline():
    for path in sorted((PKG / "model").glob("*.py")):
        bad = {m for m in imported_modules(path) if m.startswith("sglang_dflash.pipeline")}
        assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"


CPU_MAY_IMPORT = ("sglang_dflash.env", "sglang_dflash.kernels", "sglang_dflash.cpu_serving", "sglang_dflash.cpu")


def test_cpu_backend_stands_alone():
    paths = sorted((PKG / "cpu").glob("*.py"))
    assert {p.name for p in paths} >= {"__init__.py", "cpu_linear.py", "llama_stack.py"}, paths
    for path in paths:
        ours = {m for m in imported_names(path) if m == "sglang" or m.startswith(("sglang.", "sglang_dflash"))}
        bad = {
            m for m in ours if m != "sglang_dflash" and not any(m == a or m.startswith(a + ".") for a in CPU_MAY_IMPORT)
        }
        assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}: cpu/ may import only {CPU_MAY_IMPORT}"


def test_every_plain_module_imports():
    """Everything but the SGLang-facing package imports without a server (srt/ needs sglang's
    runtime; the CPU shims make it importable here, which the server tests cover)."""
    for mod in pkgutil.walk_packages([str(PKG)], "sglang_dflash."):
        if mod.name.startswith(("sglang_dflash.srt", "sglang_dflash.train.__main__", "sglang_dflash._C")):
            continue
        importlib.import_module(mod.name)


def test_serving_code_never_imports_test_helpers():
    """srt/ never imports testing/; plugin.py reaches it only through testing.switches (the test
    switches, imported when one is set)."""
    for path in sorted((PKG / "srt").glob("*.py")):
        bad = {m for m in imported_modules(path) if m.startswith("sglang_dflash.testing")}
        assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"
    plugin = {m for m in imported_modules(PKG / "plugin.py") if m.startswith("sglang_dflash.testing")}
    assert plugin == {"sglang_dflash.testing.switches"}, plugin
