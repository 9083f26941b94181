"""The width controller's acceptance estimates (pipeline/width.py): decaying per-position counts, and
the calibration of what they expect against what steps then accept."""

from __future__ import annotations

from typing import Optional, Sequence


class AcceptanceStats:
    """Decaying per-position acceptance counts for one kind of row (greedy or sampled)."""

    def __init__(
        self,
        block: int,
        half_life: float = 32.0,
        prior_mean: float = 0.6,
        prior_weight: float = 2.0,
        unseen_slowdown: float = 8.0,
    ):
        self.block = block
        self.decay = 0.5 ** (1.0 / half_life)
        self.slow_decay = 0.5 ** (1.0 / (half_life * unseen_slowdown))
        self.prior = (prior_mean * prior_weight, prior_weight)
        self.reach = [0.0] * block  # [B] index j: rows whose draft j was verified (1..B-1; 0 unused)
        self.hits = [0.0] * block  # [B] index j: rows whose draft j was accepted

    def age(self, width: int) -> None:
        """A step verified drafts 1..width-1: their older evidence weighs less. Positions it did not
        verify age `unseen_slowdown` times slower, so a narrow width keeps what a wider probe
        measured for a while (instead of drifting back to the neighbour's estimate within a few
        dozen steps and paying for a wide step to learn it again) yet still forgets it eventually."""
        for j in range(1, self.block):
            d = self.decay if j < width or width == 1 else self.slow_decay
            self.reach[j] *= d
            self.hits[j] *= d

    def update(self, accepted: Sequence[int], width: int) -> None:
        """accepted[i]: drafts accepted by row i in a step verified at `width` (0 .. width-1)."""
        for a in accepted:
            for j in range(1, min(a + 1, width - 1) + 1):  # drafts 1..a accepted, draft a+1 seen and rejected
                self.reach[j] += 1.0
                self.hits[j] += j <= a

    def conditional(self, prior: Optional[Sequence[float]] = None) -> list[float]:
        """[B] a_j = P(draft j accepted | drafts before it were); a_0 = 1. Without `prior`, each
        position is smoothed toward the estimate of the one before it (a_1 toward the prior mean):
        acceptance runs are correlated, so a position a narrow width has not verified yet looks like
        its neighbour. With `prior` ([B], one request's stats against the pooled estimate) each
        position is smoothed toward prior[j]."""
        mean, weight = self.prior[0] / self.prior[1], self.prior[1]
        out = [1.0]
        for j in range(1, self.block):
            toward = mean if prior is None else prior[j]
            mean = (self.hits[j] + weight * toward) / (self.reach[j] + weight)
            out.append(mean)
        return out

    def expected_tokens(self, prior: Optional[Sequence[float]] = None) -> list[float]:
        """[B + 1] E(W) = expected tokens committed per row at width W (index 0 unused)."""
        a, out, run = self.conditional(prior), [0.0, 1.0], 1.0
        total = 1.0
        for j in range(1, self.block):
            run *= a[j]
            total += run
            out.append(total)
        return out


class GainCalibration:
    """Expected against accepted drafts, per kind of row (greedy, sampled), over recent wide steps.

    The counts' estimate of the drafts a step accepts can sit above what the steps the controller
    then picks accept: it picks a wide step where the estimate is high (its noise included), and a
    request's acceptance can fall as it goes while its counts lag. The ratio of accepted to expected
    drafts, both decayed, scales the expected gain E(W) - 1 of every width alike; a prior of
    `prior` drafts on both sides starts it at 1, and it stays within [low, high]. Both sums age every
    step, wide or not, as the counts do: while plain steps run, it drifts back to 1 and the counts'
    own estimate (the one that makes the controller try widening again) is trusted again."""

    def __init__(self, half_life: float = 64.0, prior: float = 4.0, low: float = 0.25, high: float = 2.0):
        self.decay = 0.5 ** (1.0 / half_life)
        self.prior, self.low, self.high = prior, low, high
        self.expected = {False: 0.0, True: 0.0}
        self.accepted = {False: 0.0, True: 0.0}

    def factor(self, sampled: bool) -> float:
        ratio = (self.accepted[sampled] + self.prior) / (self.expected[sampled] + self.prior)
        return min(max(ratio, self.low), self.high)

    def age(self) -> None:
        for k in (False, True):
            self.expected[k] *= self.decay
            self.accepted[k] *= self.decay

    def observe(self, sampled: bool, expected: float, accepted: float) -> None:
        """One wide step's rows of this kind: the drafts their (uncalibrated) estimate expected it to
        accept, and the drafts it accepted."""
        self.expected[sampled] += expected
        self.accepted[sampled] += accepted
