"""Start SGLang's CPU subprocesses by fork instead of spawn.

SGLang forces the `spawn` start method, so its scheduler and detokenizer each import SGLang afresh:
on a 2-core host that is ~13 s of a ~33 s tiny-model start, paid by every restart and every test
server. The launching process has already imported all of it, and on CPU a fork is safe when:
- it is the launching process (a scheduler has thread pools and allocator state a fork would copy);
- no CUDA device is in play (a CUDA context cannot cross a fork);
- the launching process runs torch single-threaded (an OpenMP pool does not survive a fork; our
  CPU environment sets OMP_NUM_THREADS=1 for it, and each scheduler sets its own threads).
Otherwise, or with SGLANG_DFLASH_FORK_START=0, SGLang's spawn stays.
"""

from __future__ import annotations

import multiprocessing as mp
import os

from sglang_dflash import env
from sglang_dflash.cpu_serving import CPU_ENGINE_VAR


def fork_is_safe() -> bool:
    if not env.FORK_START.get() or mp.parent_process() is not None:
        return False
    if os.environ.get(CPU_ENGINE_VAR) != "1":
        return False
    import torch

    return not torch.cuda.is_available() and torch.get_num_threads() == 1


def use_fork() -> bool:
    """Fork where safe; called once the plugin loads and again after SGLang sets `spawn`."""
    if fork_is_safe():
        mp.set_start_method("fork", force=True)
        return True
    return False


def set_envs_and_config(original, server_args):
    """AROUND SGLang's `_set_envs_and_config`, which sets `spawn` (the offline Engine loads the
    plugin before it runs; the CLI loads it after)."""
    out = original(server_args)
    use_fork()
    return out
