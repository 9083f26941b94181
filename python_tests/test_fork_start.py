"""cpu/fork_start.py: when SGLang's CPU subprocesses may be forked, and that SGLang's own `spawn`
is overridden after it is set. Each case runs in a fresh interpreter (the start method is global)."""

import subprocess
import sys

import pytest

CHECK = """
import multiprocessing as mp
from sglang_dflash.cpu import fork_start
print(fork_start.fork_is_safe())
fork_start.set_envs_and_config(lambda args: mp.set_start_method("spawn", force=True), None)
print(mp.get_start_method())
"""


def run(env_overrides, monkeypatch_env):
    env = dict(monkeypatch_env)
    env.update({"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1", "SGLANG_DFLASH_FORK_START": "1"})
    env.update(env_overrides)
    env = {k: v for k, v in env.items() if v is not None}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.parametrize(
    "overrides, safe",
    [
        ({}, True),
        ({"SGLANG_DFLASH_FORK_START": "0"}, False),
        ({"SGLANG_USE_CPU_ENGINE": None}, False),  # not SGLang's CPU engine
        ({"OMP_NUM_THREADS": "2"}, False),  # an OpenMP pool would not survive the fork
    ],
)
def test_fork_only_where_safe(overrides, safe):
    import os

    assert run(overrides, os.environ) == [str(safe), "fork" if safe else "spawn"]
