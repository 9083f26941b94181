"""Builds the sglang_dflash._C extension (CPU always; CUDA when CUDA_HOME is set or FORCE_CUDA=1).

SGLANG_DFLASH_BUILD_EXT=0 skips it (the package then registers the same ops over torch references).
With no GPU visible and TORCH_CUDA_ARCH_LIST unset, CUDA code is built for sm_90 and sm_100.
"""
import os

from setuptools import setup

ext_modules, cmdclass = [], {}
if os.environ.get("SGLANG_DFLASH_BUILD_EXT", "1") != "0":
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    cxx = ["-O3", "-Wall", "-Werror", "-Wno-unknown-pragmas"]
    want_cuda = os.environ.get("FORCE_CUDA") == "1" or bool(os.environ.get("CUDA_HOME"))
    if want_cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0;10.0")
        ext = CUDAExtension("sglang_dflash._C", ["csrc/dflash_ops.cpp", "csrc/dflash_ops_cuda.cu"],
                            extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "-Werror=all-warnings"]})
    else:
        ext = CppExtension("sglang_dflash._C", ["csrc/dflash_ops.cpp"], extra_compile_args={"cxx": cxx})
    ext_modules, cmdclass = [ext], {"build_ext": BuildExtension}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
