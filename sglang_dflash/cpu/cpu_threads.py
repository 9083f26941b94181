"""How many OpenMP threads each CPU scheduler's forward runs on, whoever launched the server.

Our launcher sets OMP_NUM_THREADS=1 for every process of a server (cpu_serving.py): the launching
process must stay single-threaded for its fork to be safe (fork_start.py), and the tokenizer and
detokenizer have no use for an OpenMP pool. The forward does: on a 2-core host both cores stream the
weights about twice as fast as one. So once SGLang has placed a rank on its cores, the scheduler
sets its own thread count, the first of:
1. SGLANG_DFLASH_CPU_THREADS when present in the environment: N >= 1 threads, 0 the rank's cores
   (our launcher always sets it, carrying over a user's OMP_NUM_THREADS, because it then sets
   OMP_NUM_THREADS=1 itself);
2. OMP_NUM_THREADS, the user's own choice under a plain `sglang.launch_server`;
3. the rank's cores (SGLang's SGLANG_CPU_OMP_THREADS_BIND or NUMA node), within the process's
   affinity (taskset, cpusets) and the cgroup's CPU quota (a container's --cpus); this count then
   follows contention, fewer threads while other processes keep cores busy (cpu/contention.py).
The log names which one applied.

The GEMM and attention kernels are bit-identical at any thread count (test_bf16_linear.py,
test_chain_attention.py); the served exactness tests run at this default.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Iterable, Mapping, Optional, Union

from sglang_dflash import env
from sglang_dflash.cpu import contention

logger = logging.getLogger("sglang_dflash")
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"
# Counts we chose, not the user: these follow contention (cpu/contention.py); an explicit count is kept.
CHOSEN_BY_US = ("the rank's cores", "the cgroup's CPU quota")


def usable_cores() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def cpu_quota(path: str = CGROUP_CPU_MAX) -> Optional[int]:
    """Whole CPUs the cgroup may use (cgroup v2 `cpu.max`, "quota period" or "max period"), rounded
    up; None without a quota."""
    try:
        with open(path) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def cores_of(bound: Union[str, Iterable[int], None]) -> set[int]:
    """SGLang's binding of a rank as it passes it, a cpu-list string: a SGLANG_CPU_OMP_THREADS_BIND
    entry ("0-3,8") or its NUMA node's cpus ("0,1,2,3"); core ids also taken as a list."""
    if bound is None:
        return set()
    if not isinstance(bound, str):
        return {int(c) for c in bound}
    cores = set()
    for part in filter(None, (p.strip() for p in bound.split(","))):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def _count(name: str, value: str, allow_zero: bool) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0 or (n == 0 and not allow_zero):
        least = "0 (the rank's cores) or a thread count >= 1" if allow_zero else "a thread count >= 1"
        raise ValueError(f"{name}={value}: expected {least}")
    return n


def thread_choice(
    bound: Union[str, Iterable[int], None], environ: Mapping[str, str], usable: set[int], quota: Optional[int]
) -> tuple[int, str]:
    """(threads, what decided them) for a rank bound to `bound` (None: unbound)."""
    if env.CPU_THREADS.name in environ:
        n = _count(env.CPU_THREADS.name, environ[env.CPU_THREADS.name], allow_zero=True)
        if n:
            return n, env.CPU_THREADS.name
    elif "OMP_NUM_THREADS" in environ:
        return _count("OMP_NUM_THREADS", environ["OMP_NUM_THREADS"].split(",")[0], False), "OMP_NUM_THREADS"
    cores = len(cores_of(bound) & usable or usable)
    if quota is not None and quota < cores:
        return quota, "the cgroup's CPU quota"
    return max(1, cores), "the rank's cores"


def rank_threads(bound: Union[str, Iterable[int], None], setting: int, usable: set[int]) -> int:
    """Threads for a rank bound to `bound` with SGLANG_DFLASH_CPU_THREADS = setting, no quota."""
    return thread_choice(bound, {env.CPU_THREADS.name: str(setting)}, usable, None)[0]


def init_cpu_threads_env(original, *args, **kwargs):
    """Around SGLang's CPU rank set-up (its binding, where sgl_kernel has one): then our thread count."""
    out = original(*args, **kwargs)
    import torch

    bound = kwargs.get("local_omp_cpuid", args[0] if args else None)
    usable = usable_cores()
    n, why = thread_choice(bound, os.environ, usable, cpu_quota())
    torch.set_num_threads(n)
    follows = why in CHOSEN_BY_US and n > 1
    if follows:
        contention.install(n, cores_of(bound) & usable or usable)
    spin = os.environ.get("GOMP_SPINCOUNT", "libgomp's default")
    logger.info(
        "sglang_dflash: the forward runs on %d OpenMP thread(s), set by %s%s; GOMP_SPINCOUNT %s",
        n,
        why,
        ", fewer while other processes keep cores busy (cpu/contention.py)" if follows else "",
        spin,
    )
    return out
