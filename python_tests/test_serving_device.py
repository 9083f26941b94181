"""Which device a server runs on (cpu_serving.serving_device): with a CUDA device visible the test
servers, benches and the e2e tier run on it with SGLang's GPU defaults and no CPU-engine variable;
without one, the CPU settings CI uses. No server is started."""

import os
import subprocess
import sys

import pytest

from sglang_dflash import cpu_serving
from sglang_dflash.cpu_serving import CPU_ENGINE_VAR, CPU_ENV, serving_device
from sglang_dflash.testing import servers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The environment `make` exports on a CPU machine, inherited by everything it runs.
MAKE_ENV = {"PATH": "/usr/bin", **CPU_ENV}


def test_cuda_visible_gpu_flags_and_environment():
    dev = serving_device(True)
    assert dev.name == "cuda" and dev.flags == {"--device": "cuda"}  # SGLang picks the GPU attention backend
    env = dev.environ(MAKE_ENV)
    assert CPU_ENGINE_VAR not in env, "SGLang lets the CPU-engine variable win over CUDA"
    assert env["PATH"] == "/usr/bin"
    assert dev.environ(MAKE_ENV, {"SGLANG_DFLASH_WIDTH": "4"})["SGLANG_DFLASH_WIDTH"] == "4"


def test_no_cuda_cpu_flags_and_environment():
    dev = serving_device(False, max_total_tokens=8192)
    assert dev.name == "cpu"
    assert dev.flags["--device"] == "cpu" and dev.flags["--attention-backend"] == "torch_native"
    assert dev.flags["--max-total-tokens"] == "8192" and "--disable-cuda-graph" in dev.flags
    assert dev.flags["--sleep-on-idle"] is None  # an idle scheduler would keep a core busy
    env = dev.environ({"PATH": "/usr/bin"})
    assert env[CPU_ENGINE_VAR] == "1" and env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("visible", [True, False])
def test_harness_follows_the_machine(monkeypatch, visible):
    monkeypatch.setattr(servers, "cuda_visible", lambda: visible)
    cmd = servers.server_cmd("m", "d", "bfloat16", [], servers.server_device())
    device = cmd[cmd.index("--device") + 1]
    assert device == ("cuda" if visible else "cpu")
    assert ("--attention-backend" in cmd) is not visible and ("--max-total-tokens" in cmd) is not visible
    assert cmd[cmd.index("--speculative-draft-model-path") + 1] == "d"


def test_harness_device_can_be_forced(monkeypatch):
    monkeypatch.setattr(servers, "cuda_visible", lambda: True)
    assert servers.server_device("cpu").name == "cpu"  # bench/checks/gpu_check.sh --cpu on a GPU machine
    monkeypatch.setattr(servers, "cuda_visible", lambda: False)
    assert servers.server_device("cuda").name == "cuda"
    with pytest.raises(ValueError, match="device='gpu': expected 'cuda', 'cpu'"):
        servers.server_device("gpu")


@pytest.mark.parametrize("visible", [True, False])
def test_makefile_exports_cpu_env_only_without_gpu(tmp_path, visible):
    # The Makefile exports what `python sglang_dflash/cpu_serving.py` prints; a stand-in torch says
    # whether a CUDA device is visible.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        f"class cuda:\n    is_available = staticmethod(lambda: {visible})\n"
    )
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "sglang_dflash", "cpu_serving.py")],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert (CPU_ENGINE_VAR in p.stdout) is not visible, p.stdout


def test_cuda_visible_without_torch_reads_the_driver(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cpu_serving.cuda_visible() is False
