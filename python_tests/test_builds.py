"""The CUDA sources compile for sm_90 and sm_100 with nvcc (compile only: nothing CUDA runs here),
warnings as errors; and bench/gpu_check.sh passes its CPU mode for both tiers."""
import glob
import os
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
    env = {**os.environ, "FORCE_CUDA": "1", "CUDA_HOME": cuda_home, "TORCH_CUDA_ARCH_LIST": "9.0;10.0",
           "MAX_JOBS": "2"}
    p = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, (p.stdout + p.stderr)[-5000:]
    assert "sm_90" in p.stdout + p.stderr and "sm_100" in p.stdout + p.stderr
    assert glob.glob(str(tmp_path / "sglang_dflash" / "_C*.so"))


@pytest.mark.server
@pytest.mark.parametrize("tier", ["--kernels", "--e2e"])
def test_gpu_check_cpu_mode(tier):
    p = subprocess.run(["bash", "bench/gpu_check.sh", tier, "--cpu"], cwd=ROOT, capture_output=True, text=True,
                       timeout=1200, env={**os.environ, "PYTHON": sys.executable})
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "PASS" in p.stdout
