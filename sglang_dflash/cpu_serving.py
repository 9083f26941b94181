"""What SGLang needs to serve on a CPU-only machine: the environment and the server settings.

One definition for every user: `launch.py` (server defaults), `offline.py` and `train/datagen.py`
(`sglang.Engine`), the test servers (testing/servers.py) and engine run, and the Makefile (`python cpu_serving.py`
prints the environment). Plain Python: runnable before the package is installed.

OMP_NUM_THREADS=1: two spinning OpenMP threads on 2 cores make a small linear 100x slower.
max_total_tokens: SGLang's default KV pool takes 70% of RAM.
"""

from __future__ import annotations

import os

CPU_ENV = {"OMP_NUM_THREADS": "1", "SGLANG_USE_CPU_ENGINE": "1"}
CPU_SETTINGS = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "max_total_tokens": 16384,
    "disable_cuda_graph": True,
}


def set_cpu_env() -> None:
    """CPU_ENV into this process's environment; a value already set wins."""
    for k, v in CPU_ENV.items():
        os.environ.setdefault(k, v)


def engine_kwargs(**overrides) -> dict:
    """sglang.Engine(**engine_kwargs(), model_path=...) on CPU."""
    return {**CPU_SETTINGS, **overrides}


def server_flags(**overrides) -> dict[str, str | None]:
    """The same settings as launch_server flags: {"--device": "cpu", ..., "--disable-cuda-graph": None}
    (None: a switch without a value)."""
    flags = {}
    for key, value in engine_kwargs(**overrides).items():
        flags["--" + key.replace("_", "-")] = None if value is True else str(value)
    return flags


if __name__ == "__main__":
    print("\n".join(f"{k}={v}" for k, v in CPU_ENV.items()))
