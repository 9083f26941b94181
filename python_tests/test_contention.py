"""cpu/contention.py: the forward's thread count follows the load of the rest of the host when the count
was ours to choose, and stays where a user put it. bench/shared_host.py measures what it buys."""

import os
import subprocess
import sys
import time

from sglang_dflash.cpu import contention
from sglang_dflash.cpu.contention import Governor, busy_ticks, next_threads, process_ticks, server_family
from sglang_dflash.cpu.cpu_threads import init_cpu_threads_env


def test_the_count_leaves_others_their_cores_with_hysteresis():
    assert next_threads(2, 2, 0.1) == 2  # alone: a tokenizer's crumbs move nothing
    assert next_threads(2, 2, 0.9) == 1  # a second busy server
    assert next_threads(2, 2, 1.8) == 1  # at least one thread
    assert next_threads(1, 2, 0.9) == 1  # the other still busy: stay
    assert next_threads(1, 2, 0.7) == 1  # within the margin: no flapping
    assert next_threads(1, 2, 0.1) == 2  # the other went quiet
    assert next_threads(8, 8, 2.5) == 5
    assert next_threads(5, 8, 3.0) == 5
    assert next_threads(5, 8, 1.0) == 7


class FakeHost:
    """Busy ticks of the whole host and of our server, advanced by hand."""

    def __init__(self):
        self.now, self.busy, self.own = 0.0, 0, 0

    def run(self, seconds: float, ours: float, others: float) -> None:
        self.now += seconds
        self.own += int(ours * seconds * contention.TICK)
        self.busy += int((ours + others) * seconds * contention.TICK)


def test_the_governor_follows_a_second_server_and_comes_back():
    host, set_to = FakeHost(), []
    g = Governor(2, set_to.append, busy=lambda: host.busy, own=lambda: host.own, clock=lambda: host.now)
    for _ in range(6):  # alone: our two cores, a little load elsewhere
        g.tick()
        host.run(0.3, ours=2.0, others=0.1)
    assert set_to == [] and g.current == 2
    for _ in range(6):  # a second server takes a core
        g.tick()
        host.run(0.3, ours=1.0, others=1.0)
    assert set_to == [1]
    for _ in range(6):
        g.tick()
        host.run(0.3, ours=1.0, others=0.05)
    assert set_to == [1, 2] and g.changes == 2


def test_after_an_idle_spell_the_first_step_only_samples():
    host, set_to = FakeHost(), []
    g = Governor(2, set_to.append, busy=lambda: host.busy, own=lambda: host.own, clock=lambda: host.now)
    g.tick()
    host.run(30.0, ours=0.0, others=1.0)  # we slept while something else ran
    g.tick()
    assert set_to == []  # the average over the idle spell says nothing about now
    host.run(0.6, ours=2.0, others=0.0)
    g.tick()
    assert set_to == []


def test_on_the_real_host_a_busy_process_takes_a_thread_away():
    spin = "import time\nend = time.time() + 3\nwhile time.time() < end: pass\n"
    set_to = []
    g = Governor(2, set_to.append, own=lambda: process_ticks(os.getpid()))
    proc = subprocess.Popen([sys.executable, "-c", spin])
    try:
        end = time.monotonic() + 2.5
        while time.monotonic() < end and not set_to:
            g.tick()
            time.sleep(0.05)
    finally:
        proc.wait()
    assert set_to == [1], "a process spinning a core went unnoticed"
    # (coming back once the host is quiet: the fake host above; this host may not be quiet)


def test_our_servers_processes_are_family():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        family = server_family(os.getpid(), os.getppid())
        assert {os.getpid(), os.getppid(), child.pid} <= set(family)
    finally:
        child.kill()
        child.wait()


def test_only_a_count_we_chose_follows_contention(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(contention, "_governor", None)
    monkeypatch.setattr("sglang_dflash.cpu.cpu_threads.usable_cores", lambda: {0, 1})
    monkeypatch.setattr("sglang_dflash.cpu.cpu_threads.cpu_quota", lambda: None)
    try:
        for name in ("SGLANG_DFLASH_CPU_THREADS", "OMP_NUM_THREADS"):
            monkeypatch.setenv(name, "2")
            init_cpu_threads_env(lambda **kw: None, local_omp_cpuid=None)
            assert contention._governor is None, f"{name} set by the user must be kept"
            monkeypatch.delenv(name)
        init_cpu_threads_env(lambda **kw: None, local_omp_cpuid=None)
        assert contention._governor is not None and contention._governor.most == 2
    finally:
        torch.set_num_threads(before)


def test_busy_ticks_count_the_named_cores(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  30 0 10 500 5 0 0 7 0 0\ncpu0 10 0 5 250 5 0 0 3 0 0\ncpu1 20 0 5 250 0 0 0 4 0 0\nintr 1 2 3\n"
    )
    assert busy_ticks(path=str(stat)) == 40  # idle, iowait and steal are not busy
    assert busy_ticks([1], path=str(stat)) == 25
    assert busy_ticks([0, 1], path=str(stat)) == 40
