"""Builds the sglang_dflash._C extension (CPU always; CUDA when CUDA_HOME is set or FORCE_CUDA=1).

SGLANG_DFLASH_BUILD_EXT=0 skips it (the package then registers the same ops over torch references).
With no GPU visible and TORCH_CUDA_ARCH_LIST unset, CUDA code is built for sm_90 and sm_100.
SGLANG_DFLASH_WERROR=1 turns warnings into errors (our `make install` and build tests); off by
default, so a newer compiler's new warning cannot break a user's `pip install`.
"""

import os

from setuptools import setup


def compile_args(env=os.environ):
    """{"cxx": [...], "nvcc": [...]}: warnings as errors only when SGLANG_DFLASH_WERROR=1."""
    werror = env.get("SGLANG_DFLASH_WERROR", "").strip().lower() in ("1", "true", "yes", "on")  # as env.py
    return {
        "cxx": ["-O3", "-Wall", "-Wno-unknown-pragmas"] + (["-Werror"] if werror else []),
        "nvcc": ["-O3"] + (["-Werror=all-warnings"] if werror else []),
    }


ext_modules, cmdclass = [], {}
if os.environ.get("SGLANG_DFLASH_BUILD_EXT", "1") != "0":
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    flags = compile_args()
    depends = ["csrc/dflash_checks.h"]  # shared argument checks; listed so sdists ship it
    want_cuda = os.environ.get("FORCE_CUDA") == "1" or bool(os.environ.get("CUDA_HOME"))
    if want_cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0;10.0")
        ext = CUDAExtension(
            "sglang_dflash._C",
            ["csrc/dflash_ops.cpp", "csrc/dflash_ops_cuda.cu"],
            depends=depends,
            extra_compile_args=flags,
        )
    else:
        ext = CppExtension(
            "sglang_dflash._C", ["csrc/dflash_ops.cpp"], depends=depends, extra_compile_args={"cxx": flags["cxx"]}
        )
    ext_modules, cmdclass = [ext], {"build_ext": BuildExtension}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
