"""Every CPU kernel path runs whatever the host: SGLANG_DFLASH_CPU_ISA caps the ISA level that every
csrc kernel's dispatch reads (csrc/cpu/cpu_features.h), so an AVX512-BF16 host runs the scalar, AVX2 and
AVX-512 paths too. The level is read once per process: each level's kernel tests run in a subprocess
with the variable set (the kernels' own tests against the torch references, the shapes that take the
vector paths included), after checking that the extension reports the level and that the Python side
(cpu/cpu_linear.py) asks the extension, not /proc/cpuinfo.

The extension's detection is checked against /proc/cpuinfo's flags (kernels/reference.cpu_isa_ref):
two independent readings of the CPU.
"""

import json
import os
import subprocess
import sys

import pytest

from sglang_dflash import kernels
from sglang_dflash.cpu_serving import CPU_ENV
from sglang_dflash.kernels.reference import ISA_LEVELS, cpu_isa_ref

HERE = os.path.dirname(os.path.abspath(__file__))
VAR = "SGLANG_DFLASH_CPU_ISA"
DETECTED = ISA_LEVELS[kernels.ops().cpu_isa()[1]]
AVAILABLE = ISA_LEVELS[: ISA_LEVELS.index(DETECTED) + 1]
# Each kernel's tests against its torch reference (every ISA-dispatched op: GEMM, norm, RoPE, the
# verify/draft attention and the one-call layer that chains them).
KERNEL_TESTS = [
    "test_bf16_linear.py",
    "test_rms_norm.py",
    "test_rope.py",
    "test_chain_attention.py",
    "test_llama_layer.py",
]
# What one process reports: the extension's (level, detected), the Python side's reading of it.
PROBE = """
import json
from sglang_dflash import kernels
from sglang_dflash.cpu import cpu_linear
print(json.dumps({"isa": kernels.cpu_isa(), "dot_bf16": cpu_linear.dot_bf16(), "amx_bf16": cpu_linear.amx_bf16()}))
"""


def child_env(level):
    env = {**CPU_ENV, **{k: v for k, v in os.environ.items() if k != VAR}}  # make test's CPU environment
    if level is not None:
        env[VAR] = level
    return env


def probe(level):
    p = subprocess.run([sys.executable, "-c", PROBE], env=child_env(level), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_extension_reads_the_cpu_as_proc_cpuinfo_does(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert kernels.load() == "extension", "the C++ extension must be built (pip install -e . builds it)"
    assert kernels.ops().cpu_isa()[1] == cpu_isa_ref()[1], (DETECTED, ISA_LEVELS[cpu_isa_ref()[1]])


@pytest.mark.parametrize("level", AVAILABLE)
def test_each_available_isa_level_runs_every_kernel_against_its_reference(level):
    got = probe(level)
    assert got["isa"] == [level, DETECTED], got  # the extension dispatches on the capped level
    at = ISA_LEVELS.index(level)
    assert got["dot_bf16"] == (at >= ISA_LEVELS.index("avx512bf16")), got  # Python asks the extension
    assert got["amx_bf16"] == (at >= ISA_LEVELS.index("amx")), got
    tests = [os.path.join(HERE, t) for t in KERNEL_TESTS]
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    p = subprocess.run(cmd, env=child_env(level), capture_output=True, text=True, timeout=1200, cwd=HERE)
    assert p.returncode == 0, f"{VAR}={level}: kernel tests fail\n{p.stdout[-4000:]}"
    assert " passed" in p.stdout and " skipped" not in p.stdout, p.stdout[-1000:]


def test_a_level_above_the_cpu_is_capped_at_the_cpu():
    assert probe("amx")["isa"] == [DETECTED, DETECTED]
    assert probe(None)["isa"] == [DETECTED, DETECTED]  # unset: the CPU's best


def test_an_unknown_level_is_an_error_naming_the_choices():
    code = "import torch\nfrom sglang_dflash import kernels\nkernels.load()\ntorch.ops.sglang_dflash.cpu_isa()"
    p = subprocess.run([sys.executable, "-c", code], env=child_env("avx9"), capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and f"{VAR}=avx9" in p.stderr and "avx512bf16" in p.stderr, p.stderr[-2000:]
    code = "from sglang_dflash import kernels\nkernels.cpu_isa()"
    p = subprocess.run([sys.executable, "-c", code], env=child_env("avx9"), capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "ValueError" in p.stderr and "avx512bf16" in p.stderr, p.stderr[-2000:]


def test_the_reference_build_reads_the_same_levels():
    """Without the extension (the torch reference ops) the op is the /proc/cpuinfo reading, capped alike."""
    from sglang_dflash import env

    code = "from sglang_dflash import kernels\nprint(kernels.load(), *kernels.cpu_isa())"
    child = {**child_env("avx2"), env.REFERENCE_OPS.name: "1"}
    p = subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["reference", ISA_LEVELS[min(1, ISA_LEVELS.index(DETECTED))], DETECTED], p.stdout
