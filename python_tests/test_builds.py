"""The CUDA sources compile for sm_90 and sm_100 (the arch list when no GPU is visible) with nvcc (compile only: nothing CUDA runs here),
warnings as errors (SGLANG_DFLASH_WERROR=1; off for users' installs); the CPU and CUDA ops share
csrc/dflash_checks.h; and bench/checks/gpu_check.sh passes its CPU mode for both tiers."""

import ast
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_cuda_home():
    for cand in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if cand and os.path.exists(os.path.join(cand, "bin", "nvcc")):
            return cand
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None


def test_cuda_extension_compiles_for_sm90_sm100(tmp_path):
    cuda_home = find_cuda_home()
    assert cuda_home, "nvcc not found: install the CUDA toolkit (nvcc 13) to compile-check csrc/"
    for f in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, f), tmp_path)
    shutil.copytree(os.path.join(ROOT, "csrc"), tmp_path / "csrc")
    (tmp_path / "sglang_dflash").mkdir()
    (tmp_path / "sglang_dflash" / "__init__.py").write_text("")
    env = {
        **os.environ,
        "FORCE_CUDA": "1",
        "CUDA_HOME": cuda_home,
        "TORCH_CUDA_ARCH_LIST": "9.0;10.0",
        "MAX_JOBS": "2",
        "SGLANG_DFLASH_WERROR": "1",
    }
    p = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-5000:]
    assert "sm_90" in out and "sm_100" in out
    assert "-Werror=all-warnings" in out and re.search(r"-Werror(\s|')", out), "built without warnings-as-errors"
    assert glob.glob(str(tmp_path / "sglang_dflash" / "_C*.so"))


def load_setup_function(name):
    """A function of setup.py, without running setup() (setup.py has top-level side effects)."""
    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    ns = {"os": os}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "setup.py", "exec"), ns)
    return ns[name]


def load_compile_args():
    return load_setup_function("compile_args")


def test_cuda_arch_list_follows_user_then_visible_gpu_then_default():
    arch = load_setup_function("cuda_arch_list")
    assert arch({"TORCH_CUDA_ARCH_LIST": "8.0"}, capabilities=[(9, 0)]) == "8.0"  # the user's list wins
    assert arch({}, capabilities=[(8, 9)]) == "8.9"  # an L4: its own architecture, not 9.0;10.0
    assert arch({"TORCH_CUDA_ARCH_LIST": " "}, capabilities=[(9, 0), (9, 0), (8, 0)]) == "8.0;9.0"
    assert arch({}, capabilities=[]) == "9.0;10.0"  # no GPU visible


def test_werror_only_when_asked():
    compile_args = load_compile_args()
    for env in ({}, {"SGLANG_DFLASH_WERROR": "0"}, {"SGLANG_DFLASH_WERROR": ""}):
        flags = compile_args(env)
        assert not any(f.startswith("-Werror") for f in flags["cxx"] + flags["nvcc"]), flags
        assert "-Wall" in flags["cxx"]
    flags = compile_args({"SGLANG_DFLASH_WERROR": "1"})
    assert "-Werror" in flags["cxx"] and "-Werror=all-warnings" in flags["nvcc"]
    make = open(os.path.join(ROOT, "Makefile")).read()
    assert re.search(r"SGLANG_DFLASH_WERROR=1 \$\(PIP\) install [^\n]*-e \.", make), (
        "make install must build with -Werror"
    )


def function_body(src, name):
    """The text of C++ function `name`'s definition (from its name to the matching closing brace)."""
    start = re.search(rf"\b{name}\([^;]*?\)\s*{{", src, re.S)
    assert start, name
    depth, i = 0, start.end() - 1
    for j in range(i, len(src)):
        depth += {"{": 1, "}": -1}.get(src[j], 0)
        if depth == 0:
            return src[start.start() : j + 1]
    raise AssertionError(name)


@pytest.mark.parametrize(
    "source, fn, launch",
    [
        ("dflash_ops.cpp", "write_draft_kv_cpu", "at::parallel_for"),
        ("dflash_ops_cuda.cu", "write_draft_kv_cuda", "launch_write<"),
    ],
)
def test_write_draft_kv_uses_shared_checks(source, fn, launch):
    # The CUDA path cannot run here: check that, like the CPU one, it validates with the shared header
    # (args, then slot/position bounds) before anything is written; the compile test builds both.
    src = open(os.path.join(ROOT, "csrc", source)).read()
    assert '#include "dflash_checks.h"' in src
    body = function_body(src, fn)
    args = body.find("checks::check_write_draft_kv_args(")
    bounds = body.find("checks::check_write_draft_kv_bounds(")
    assert 0 <= args < bounds < body.find(launch), body
    assert "TORCH_CHECK(slot" not in src and "check_write_args" not in src  # no second, diverging copy
    header = open(os.path.join(ROOT, "csrc", "dflash_checks.h")).read()
    assert "slot " in header and "the KV pool has " in header


@pytest.mark.server
@pytest.mark.parametrize("tier", ["--kernels", "--e2e"])
def test_gpu_check_cpu_mode(tier):
    p = subprocess.run(
        ["bash", "bench/checks/gpu_check.sh", tier, "--cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "PASS" in p.stdout
