"""Builds the sglang_dflash._C extension (CPU always; CUDA when CUDA_HOME is set or FORCE_CUDA=1).

SGLANG_DFLASH_BUILD_EXT=0 skips it (the package then registers the same ops over torch references).
CUDA code is built for TORCH_CUDA_ARCH_LIST when set, else for the visible GPUs' architectures, else
(no GPU visible) for sm_90 and sm_100.
SGLANG_DFLASH_WERROR=1 turns warnings into errors (our `make install` and build tests); off by
default, so a newer compiler's new warning cannot break a user's `pip install`.
"""

import os

from setuptools import setup


def compile_args(env=os.environ):
    """{"cxx": [...], "nvcc": [...]}: warnings as errors only when SGLANG_DFLASH_WERROR=1. -fopenmp:
    at::parallel_for in our CPU kernels splits work over torch's OpenMP threads only when the
    extension itself is built with OpenMP (its loop is inlined from ATen's headers); with one thread
    (OMP_NUM_THREADS=1, the CPU serving default) it runs inline as before."""
    werror = env.get("SGLANG_DFLASH_WERROR", "").strip().lower() in ("1", "true", "yes", "on")  # as env.py
    return {
        "cxx": ["-O3", "-fopenmp", "-Wall", "-Wno-unknown-pragmas"] + (["-Werror"] if werror else []),
        "nvcc": ["-O3"] + (["-Werror=all-warnings"] if werror else []),
    }


def visible_capabilities() -> list:
    """[(major, minor)] of every visible CUDA device ([] without one, or without torch's CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]


def cuda_arch_list(env=os.environ, capabilities=None) -> str:
    """TORCH_CUDA_ARCH_LIST for the CUDA build: the user's when set; else the visible GPUs'
    (capabilities [(major, minor)], default: asked from torch); else "9.0;10.0" (H100/H200, B200),
    since with no GPU and no list torch's build has no architecture to target."""
    if env.get("TORCH_CUDA_ARCH_LIST", "").strip():
        return env["TORCH_CUDA_ARCH_LIST"]
    if capabilities is None:
        capabilities = visible_capabilities()
    if capabilities:
        return ";".join(sorted({f"{major}.{minor}" for major, minor in capabilities}))
    return "9.0;10.0"


ext_modules, cmdclass = [], {}
if os.environ.get("SGLANG_DFLASH_BUILD_EXT", "1") != "0":
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    flags = compile_args()
    # csrc/ holds the speculative-decoding ops (both devices), the one schema registration and the
    # checks they share; csrc/cpu/ the CPU target backend's kernels. Includes are written from csrc/.
    cpu_kernels = ("bf16_linear", "rope", "chain_attention", "rms_norm", "llama_layer", "packed_linear")
    sources = ["csrc/dflash_ops.cpp"] + [f"csrc/cpu/{name}_cpu.cpp" for name in cpu_kernels]
    # included headers; listed so sdists ship them
    headers = ("chain_attention_body", "chain_attention_dp", "cpu_features", "cpu_ops", "bf16_vec", "bf16_linear_dp")
    depends = ["csrc/accept_rule.h", "csrc/dflash_checks.h"] + [f"csrc/cpu/{name}.h" for name in headers]
    include_dirs = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")]
    want_cuda = os.environ.get("FORCE_CUDA") == "1" or bool(os.environ.get("CUDA_HOME"))
    if want_cuda:
        os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch_list()
        print("sglang_dflash: building CUDA for TORCH_CUDA_ARCH_LIST=" + os.environ["TORCH_CUDA_ARCH_LIST"])
        ext = CUDAExtension(
            "sglang_dflash._C",
            sources + ["csrc/dflash_ops_cuda.cu"],
            depends=depends,
            include_dirs=include_dirs,
            extra_compile_args=flags,
            extra_link_args=["-fopenmp"],
        )
    else:
        ext = CppExtension(
            "sglang_dflash._C",
            sources,
            depends=depends,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": flags["cxx"]},
            extra_link_args=["-fopenmp"],
        )
    ext_modules, cmdclass = [ext], {"build_ext": BuildExtension}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
