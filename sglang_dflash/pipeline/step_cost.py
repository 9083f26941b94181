"""Seconds per decode step, cost(bs, W), for the verify-width controller (pipeline/width.py): the
start-up profile of dummy steps (srt/step_profile.py), forced monotone, corrected online by the
ratio of real to profiled step times."""

from __future__ import annotations

import bisect
import math
from typing import Sequence


class CostTable:
    """Seconds per decode step, cost(bs, W): profiled at start-up, corrected online per width."""

    def __init__(self, batch_sizes: Sequence[int], widths: Sequence[int], seconds: dict, alpha: float = 0.1):
        """seconds[(bs, W)] for every profiled bs and candidate W; forced monotone in bs and W."""
        self.batch_sizes, self.widths, self.alpha = sorted(batch_sizes), sorted(widths), alpha
        self.table = {}
        for w_i, w in enumerate(self.widths):
            prev = 0.0
            for bs in self.batch_sizes:
                floor = max(prev, self.table.get((bs, self.widths[w_i - 1]), 0.0) if w_i else 0.0)
                prev = self.table[(bs, w)] = max(float(seconds[(bs, w)]), floor)
        self.correction = {w: 1.0 for w in self.widths}
        self.observed: dict = {}  # width -> real steps run at it

    def profiled(self, bs: int, w: int) -> float:
        """Linear interpolation between profiled batch sizes; below the smallest its cost, beyond the
        largest a linear extrapolation of the last two (a step never gets cheaper with more rows)."""
        sizes = self.batch_sizes
        i = bisect.bisect_left(sizes, bs)
        if i < len(sizes) and (sizes[i] == bs or i == 0):
            return self.table[(sizes[i], w)]
        lo, hi = (sizes[i - 1], sizes[i]) if i < len(sizes) else (sizes[max(i - 2, 0)], sizes[i - 1])
        t_lo, t_hi = self.table[(lo, w)], self.table[(hi, w)]
        if hi == lo:  # one profiled size: proportional to the rows
            return t_hi * bs / hi
        return t_lo + (t_hi - t_lo) * (bs - lo) / (hi - lo)

    def __call__(self, bs: int, w: int) -> float:
        return self.profiled(bs, w) * self.factor(w)

    def factor(self, w: int) -> float:
        """The online correction of width w; a width no real step has run yet borrows the others'
        (their log-mean weighted by steps run: what makes real steps differ from the dummy ones, the
        scheduler's share and the host's pace, is common to all widths; else a width never played,
        often W = 1 under load, keeps a profile the others have corrected, and never gets played)."""
        if w in self.observed:
            return self.correction[w]
        n = sum(self.observed.values())
        return math.exp(sum(k * math.log(self.correction[v]) for v, k in self.observed.items()) / n) if n else 1.0

    def observe(self, bs: int, w: int, seconds: float) -> None:
        ratio = min(max(seconds / max(self.profiled(bs, w), 1e-9), 0.2), 5.0)
        if w not in self.observed:  # the first real step starts from the borrowed factor
            self.correction[w] = self.factor(w)
        self.observed[w] = self.observed.get(w, 0) + 1
        self.correction[w] += self.alpha * (ratio - self.correction[w])

    def describe(self) -> str:
        rows = ["bs\\W " + " ".join(f"{w:>8d}" for w in self.widths)]
        for bs in self.batch_sizes:
            rows.append(f"{bs:>4d} " + " ".join(f"{self.table[(bs, w)] * 1e3:>6.1f}ms" for w in self.widths))
        return "\n".join(rows)
