"""The forward's thread count following contention: every core alone, fewer while others keep cores busy.

OpenMP teams assume they own their cores. When another process (a second server, a training job, a
load generator) keeps a core busy, a team as wide as the host waits at every barrier for the thread
that lost its core, and two such servers slow each other down far below a fair share. So when the
thread count was ours to choose (cpu_threads.thread_choice: the rank's cores or the cgroup's quota,
not a user's explicit count), the scheduler measures, twice a second, how many of its cores the rest
of the host kept busy (/proc/stat's busy time of those cores minus our server's own processes) and
runs on the cores left, at least one. Hysteresis (MARGIN) keeps a short burst elsewhere from flapping the count.

Lossless at any count: the GEMM and attention kernels are bit-identical at any thread count
(test_bf16_linear.py, test_chain_attention.py), so changing it between steps changes no token.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Iterable, Optional

logger = logging.getLogger("sglang_dflash")

INTERVAL_S = 0.5  # how often the host is sampled, in wall time between two scheduler steps
MARGIN = 0.4  # cores of others' load beyond the ones we leave them before we move
FAMILY_REFRESH_S = 10.0
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_ticks(cores: Optional[Iterable[int]] = None, path: str = "/proc/stat") -> int:
    """Busy clock ticks of these cores (all without): user, nice, system, irq, softirq (not idle,
    iowait or a VM's steal)."""
    wanted = None if cores is None else {f"cpu{c}" for c in cores}
    total = 0
    with open(path) as f:
        for line in f:
            fields = line.split()
            if not fields or not fields[0].startswith("cpu"):
                break
            if fields[0] == "cpu" if wanted is None else fields[0] in wanted:
                user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
                total += user + nice + system + irq + softirq
    return total


def process_ticks(pid: int) -> int:
    """utime + stime of every thread of `pid` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return int(fields[11]) + int(fields[12])


def server_family(me: int, parent: int) -> list[int]:
    """Our server's processes: the launching process and its children (scheduler, detokenizer...)."""
    family = {me, parent}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid in (parent, me):
                family.add(int(name))
    return sorted(family)


def next_threads(current: int, most: int, others: float) -> int:
    """Threads for the next interval, given the cores the rest of the host kept busy in the last one."""
    left = most - current  # cores our count already leaves to others
    if others > left + MARGIN:
        return max(1, most - int(others + 1 - MARGIN))
    if others < left - MARGIN:
        return min(most, max(current + 1, most - int(others + 1 - MARGIN)))
    return current


class Governor:
    """Sets torch's thread count between scheduler steps; `tick` is called before every forward."""

    def __init__(
        self,
        most: int,
        set_threads: Callable[[int], None],
        busy: Callable[[], int] = busy_ticks,
        own: Optional[Callable[[], int]] = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.most = self.current = most
        self.set_threads, self.busy, self.clock = set_threads, busy, clock
        self.own = own if own is not None else self._family_ticks
        self.family: list[int] = []
        self.family_at = -FAMILY_REFRESH_S
        self.changes = 0
        self.at: Optional[float] = None

    def _family_ticks(self) -> int:
        now = self.clock()
        if now - self.family_at >= FAMILY_REFRESH_S:
            self.family, self.family_at = server_family(os.getpid(), os.getppid()), now
        return sum(process_ticks(pid) for pid in self.family)

    def _sample(self, now: float) -> None:
        self.at, self.busy_at, self.own_at = now, self.busy(), self.own()

    def tick(self) -> None:
        now = self.clock()
        if self.at is None or now - self.at > 4 * INTERVAL_S:  # first step, or after an idle spell
            self._sample(now)
            return
        if now - self.at < INTERVAL_S:
            return
        busy0, own0, at0 = self.busy_at, self.own_at, self.at
        self._sample(now)
        others = max(0.0, ((self.busy_at - busy0) - (self.own_at - own0)) / TICK / (now - at0))
        want = next_threads(self.current, self.most, others)
        if want != self.current:
            logger.info(
                "sglang_dflash: %d OpenMP thread(s) (was %d): the rest of the host kept %.1f core(s) busy",
                want,
                self.current,
                others,
            )
            self.current = want
            self.changes += 1
            self.set_threads(want)


_governor: Optional[Governor] = None


def install(most: int, cores: set[int]) -> Governor:
    """Follow contention on `cores`, the ones the rank runs on (other ranks' cores are theirs)."""
    import torch

    global _governor
    _governor = Governor(most, torch.set_num_threads, busy=lambda: busy_ticks(sorted(cores)))
    return _governor


def tick() -> None:
    """Before a scheduler step: follow contention when the thread count is ours to choose."""
    if _governor is not None:
        _governor.tick()


def stats() -> dict:
    """For the worker's /server_info counters: the count chosen at start-up, and times it moved."""
    import torch

    if _governor is None:
        return {"threads_chosen": torch.get_num_threads(), "thread_changes": 0}
    return {"threads_chosen": _governor.most, "thread_changes": _governor.changes}
