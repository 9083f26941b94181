"""Each CPU scheduler's forward runs on every core its rank is bound to.

Our CPU environment sets OMP_NUM_THREADS=1 for every process of a server (cpu_serving.py): the
launching process must stay single-threaded for its fork to be safe (fork_start.py), and the
tokenizer and detokenizer have no use for an OpenMP pool. The forward does: on a 2-core host both
cores stream the weights about twice as fast as one, and served side by side (bench/real_bench.py,
run 2026-12-06-3e5f6a3, threads) two threads beat one at every concurrency tried, for plain
decoding (1.16-1.29x) and for DFLASH (1.10-1.39x), the tokenizer, detokenizer, HTTP server and the
load generator sharing the cores. So once SGLang has placed a rank on its cores, the scheduler sets
its own thread count: SGLANG_DFLASH_CPU_THREADS (0: the rank's cores).

The GEMM and attention kernels are bit-identical at any thread count (test_bf16_linear.py,
test_chain_attention.py); the served exactness tests run at this default.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, Union

from sglang_dflash import env

logger = logging.getLogger("sglang_dflash")


def usable_cores() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


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


def rank_threads(bound: Union[str, Iterable[int], None], setting: int, usable: set[int]) -> int:
    """Threads for a rank bound to `bound` (None: unbound), SGLANG_DFLASH_CPU_THREADS = setting."""
    if setting < 0:
        raise ValueError(f"{env.CPU_THREADS.name}={setting}: expected 0 (the rank's cores) or a thread count >= 1")
    if setting:
        return setting
    cores = cores_of(bound) & usable
    return max(1, len(cores or usable))


def init_cpu_threads_env(original, *args, **kwargs):
    """Around SGLang's CPU rank set-up (its binding, where sgl_kernel has one): then our thread count."""
    out = original(*args, **kwargs)
    import torch

    bound = kwargs.get("local_omp_cpuid", args[0] if args else None)
    n = rank_threads(bound, env.CPU_THREADS.get(), usable_cores())
    torch.set_num_threads(n)
    logger.info("sglang_dflash: the forward runs on %d OpenMP thread(s) (%s)", n, env.CPU_THREADS.name)
    return out
