"""What SGLang needs to serve on a CPU-only machine, and which device a server runs on.

One definition for every user: `launch.py` (server defaults), `offline.py` and `train/datagen.py`
(`sglang.Engine`), the test servers (testing/servers.py) and engine run, and the Makefile (`python cpu_serving.py`
prints the environment, nothing when a CUDA device is visible). Plain Python: runnable before the package is installed.

OMP_NUM_THREADS=1 for every process (two spinning OpenMP threads on 2 cores beside another busy
process make a small linear 100x slower); each scheduler then runs its forward on its rank's cores
(cpu/cpu_threads.py, SGLANG_DFLASH_CPU_THREADS), or on the threads the user asked for: a user's own
OMP_NUM_THREADS is carried over as SGLANG_DFLASH_CPU_THREADS, which the forward reads first.
max_total_tokens: SGLang's default KV pool takes 70% of RAM.
sleep_on_idle: an idle scheduler otherwise polls its sockets nonstop, a whole core of a 2-core host
(measured: 10.1 core-seconds in 10 idle seconds without it, 0.14 with it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

# SGLang's platform choice lets this variable win over a visible CUDA device: a GPU server that
# inherits it (the Makefile exports CPU_ENV) would run an 8B model on one CPU thread.
CPU_ENGINE_VAR = "SGLANG_USE_CPU_ENGINE"
CPU_ENV = {"OMP_NUM_THREADS": "1", CPU_ENGINE_VAR: "1"}
# How long an idle OpenMP thread spins before it sleeps (libgomp's default is 300000 spins when the
# threads fit the cores): a second busy process on the host then finds its core spun away, and
# sleeping at once makes every parallel region pay a wake-up. 10000 spins keeps one server's speed
# and lets two busy servers share (docs/decisions/2026-12-07-shared-host.md).
OMP_WAIT = {"GOMP_SPINCOUNT": "10000"}
THREADS_VAR = "SGLANG_DFLASH_CPU_THREADS"  # declared in env.py (CPU_THREADS), which takes its name from here
CPU_SETTINGS = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "max_total_tokens": 16384,
    "disable_cuda_graph": True,
    "sleep_on_idle": True,
}


def cpu_env(inherited: Mapping[str, str]) -> dict[str, str]:
    """CPU_ENV for a server started from the environment `inherited`, plus the forward's thread count:
    SGLANG_DFLASH_CPU_THREADS as inherited, else the user's OMP_NUM_THREADS (which CPU_ENV replaces),
    else 0 (the rank's cores)."""
    threads = inherited.get(THREADS_VAR) or inherited.get("OMP_NUM_THREADS", "").split(",")[0] or "0"
    return {**CPU_ENV, **OMP_WAIT, THREADS_VAR: threads}


def set_cpu_env() -> None:
    """cpu_env() into this process's environment; a value already set wins."""
    for k, v in cpu_env(os.environ).items():
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


def cuda_visible() -> bool:
    """A CUDA device this process could use: torch's answer when torch imports (the harness, the
    launcher), else the NVIDIA driver's device list (the Makefile runs this file before install)."""
    try:
        import torch
    except ImportError:
        gpus = "/proc/driver/nvidia/gpus"
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1")
        return not hidden and os.path.isdir(gpus) and bool(os.listdir(gpus))
    return torch.cuda.is_available()


@dataclass(frozen=True)
class ServingDevice:
    name: str  # "cuda" or "cpu"
    flags: dict[str, Optional[str]]  # launch_server flags (None: a switch without a value)
    env: dict[str, str] = field(default_factory=dict)  # set in the server's environment
    unset: tuple[str, ...] = ()  # dropped from the environment the server inherits

    def environ(self, inherited: Mapping[str, str], overrides: Optional[Mapping[str, str]] = None) -> dict[str, str]:
        """The server's environment: inherited minus `unset`, plus `env`, plus the caller's overrides."""
        kept = {k: v for k, v in inherited.items() if k not in self.unset}
        added = {**cpu_env(inherited), **self.env} if self.name == "cpu" else self.env
        return {**kept, **added, **(overrides or {})}


def serving_device(cuda: bool, **cpu_overrides) -> ServingDevice:
    """cuda: a CUDA device is visible (cuda_visible()). With one: --device cuda, SGLang's default GPU
    attention backend and KV pool size, and no CPU-engine variable; without: CPU_ENV and the CPU
    settings (cpu_overrides replace some, e.g. max_total_tokens)."""
    if cuda:
        return ServingDevice("cuda", {"--device": "cuda"}, unset=(CPU_ENGINE_VAR,))
    return ServingDevice("cpu", server_flags(**cpu_overrides), env=dict(CPU_ENV))


if __name__ == "__main__":
    if not cuda_visible():
        print("\n".join(f"{k}={v}" for k, v in cpu_env(os.environ).items()))
