"""srt/cpu_threads.py: how many OpenMP threads a CPU scheduler's forward gets (the served counts are
checked by test_forced.py: one server, every core; test_scale_out.py: replicas and --dp-size ranks, a share each)."""

import pytest

from sglang_dflash.srt.cpu_threads import init_cpu_threads_env, rank_threads


def test_the_rank_gets_the_cores_it_is_bound_to_and_may_use():
    usable = {0, 1, 2, 3}
    assert rank_threads(None, 0, usable) == 4  # unbound: every core of the process
    assert rank_threads([2, 3], 0, usable) == 2
    assert rank_threads([3, 4, 5], 0, usable) == 1  # cores outside the affinity mask do not count
    assert rank_threads([8, 9], 0, usable) == 4  # a binding wholly outside it: the process's cores
    assert rank_threads([0, 1], 3, usable) == 3  # an explicit count wins
    # SGLANG_CPU_OMP_THREADS_BIND entries (our launcher's and replicas.py's splits) are cpu-list strings
    assert rank_threads("1", 0, usable) == 1
    assert rank_threads("0-2", 0, usable) == 3
    assert rank_threads("0,2-3,7", 0, usable) == 3


def test_a_negative_count_names_the_variable():
    with pytest.raises(ValueError, match="SGLANG_DFLASH_CPU_THREADS=-1"):
        rank_threads(None, -1, {0})


def test_the_hook_sets_torchs_threads_after_sglangs_setup(monkeypatch):
    import torch

    calls = []
    before = torch.get_num_threads()
    monkeypatch.setenv("SGLANG_DFLASH_CPU_THREADS", "3")
    try:
        init_cpu_threads_env(lambda **kw: calls.append(kw), local_omp_cpuid=[0], dist_init_method=None)
        assert calls == [{"local_omp_cpuid": [0], "dist_init_method": None}]
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
