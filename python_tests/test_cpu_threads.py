"""cpu/cpu_threads.py: how many OpenMP threads a CPU scheduler's forward gets (the served counts are
checked by test_forced.py: one server, every core; test_scale_out.py: replicas and --dp-size ranks, a share each)."""

import os

import pytest

from sglang_dflash.cpu_serving import cpu_env
from sglang_dflash.cpu.cpu_threads import cpu_quota, init_cpu_threads_env, rank_threads, thread_choice


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


def test_an_explicit_choice_wins_and_says_which():
    usable = {0, 1, 2, 3}
    ours = "SGLANG_DFLASH_CPU_THREADS"
    assert thread_choice(None, {}, usable, None) == (4, "the rank's cores")
    # a plain sglang.launch_server: the user's OMP_NUM_THREADS decides
    assert thread_choice(None, {"OMP_NUM_THREADS": "1"}, usable, None) == (1, "OMP_NUM_THREADS")
    assert thread_choice(None, {"OMP_NUM_THREADS": "2,1"}, usable, None) == (2, "OMP_NUM_THREADS")
    # our launcher: OMP_NUM_THREADS=1 is its own, the forward's count travels in our variable
    assert thread_choice(None, {"OMP_NUM_THREADS": "1", ours: "0"}, usable, None) == (4, "the rank's cores")
    assert thread_choice(None, {"OMP_NUM_THREADS": "1", ours: "3"}, usable, None) == (3, ours)
    # a container's CPU quota caps the cores it may use
    assert thread_choice(None, {}, usable, 2) == (2, "the cgroup's CPU quota")
    assert thread_choice([1], {}, usable, 2) == (1, "the rank's cores")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS=0"):
        thread_choice(None, {"OMP_NUM_THREADS": "0"}, usable, None)


def test_our_launcher_carries_a_users_thread_count_over():
    assert cpu_env({})["SGLANG_DFLASH_CPU_THREADS"] == "0"
    assert cpu_env({"OMP_NUM_THREADS": "3"})["SGLANG_DFLASH_CPU_THREADS"] == "3"
    assert cpu_env({"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "1"
    assert cpu_env({"OMP_NUM_THREADS": "3", "SGLANG_DFLASH_CPU_THREADS": "2"})["SGLANG_DFLASH_CPU_THREADS"] == "2"


def test_the_cgroup_quota_is_read(tmp_path):
    f = tmp_path / "cpu.max"
    f.write_text("150000 100000\n")
    assert cpu_quota(str(f)) == 2
    f.write_text("max 100000\n")
    assert cpu_quota(str(f)) is None
    assert cpu_quota(str(tmp_path / "absent")) is None


def test_a_cpu_dflash_server_sleeps_when_idle_and_spins_briefly(monkeypatch):
    from sglang_dflash.srt.hooks import cpu_defaults

    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert cpu_defaults("cuda") == {}
    assert "GOMP_SPINCOUNT" not in os.environ
    assert cpu_defaults("cpu") == {"sleep_on_idle": True}
    assert os.environ["GOMP_SPINCOUNT"] == "10000"  # for the schedulers spawned from here
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    cpu_defaults("cpu")
    assert os.environ["GOMP_SPINCOUNT"] == "7"  # a user's own setting wins
    assert cpu_env({})["GOMP_SPINCOUNT"] == "10000"  # our launcher sets it before any process starts
