"""Stage 0 of a decode step: choose the verify width W (1 = plain decoding, no draft forward).

A step at width W verifies [anchor, d_1 .. d_{W-1}] per request and commits 1 + (accepted drafts)
tokens per request. The controller picks, before each step, the W of a small fixed candidate set
(so each can get its own CUDA graph later) that maximises expected committed tokens per second:

    rate(W) = sum over rows of E_row(W) / cost(bs, W)

- E_row(W) = 1 + sum_{k<W} prod_{j<=k} a_j, where a_j is the observed probability that draft j is
  accepted given drafts 1..j-1 were (kept apart for greedy and sampled rows: acceptance depends on
  the temperature). Counts decay with every step (a recent window); a position with
  few counts borrows the estimate of the position before it, so widening is tried when the
  positions a narrow width does verify are accepted.
- Each request also keeps its own counts, smoothed toward that pooled estimate: requests differ
  (one accepting 1.3 tokens a block beside others at 3), and the rows left in a batch's tail are
  the slow ones, so a pooled estimate alone over-widens exactly when few rows remain.
- cost(bs, W) is the start-up profile (forced monotone in bs and W), corrected online by the ratio
  of observed to profiled step times per width (pipeline/step_cost.py).
- `widen_margin` (relative; default 0, off) makes speculating beat plain decoding's rate by that
  much. A 5% margin measured worse at concurrency 16 than none (docs/decisions/2026-12-07-widen-margin.md).
- A step only observes the positions it verifies; counts past its width age 8x slower, so what a
  wider step measured is kept (not re-learnt by a wide step every few dozen steps). While W = 1
  nothing is observed and all counts age; a probe step at the best W > 1 runs every so often,
  spaced so that a probe that accepts nothing costs at most `probe_budget` of the time.
- A request may cap the width (`cap`: the widest candidate within it is played); a capped step ages
  no counts, so what the controller learnt survives a stretch of capped batches.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections import Counter
from typing import Optional, Sequence

from sglang_dflash.pipeline.step_cost import CostTable

DEFAULT_WIDTHS = (1, 2, 4, 8, 16)


def candidate_widths(block: int) -> list[int]:
    """The default candidate set for a drafter block size: powers of two up to B, and B itself."""
    return sorted({w for w in DEFAULT_WIDTHS if w <= block} | {block})


def load_width_config(path: str, block: int) -> dict:
    """SGLang's --speculative-adaptive-config shape, {"<min batch size>": {"candidate_steps": [s, ...]}},
    -> {min_bs: [W, ...]} with W = s + 1 (s drafts verified; s = 0 is plain decoding)."""
    with open(path) as f:
        raw = json.load(f)
    out = {}
    for key, entry in raw.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or not all(isinstance(x, int) and 0 <= x < block for x in steps):
            raise ValueError(
                f"{path}: [{key!r}].candidate_steps must be a non-empty list of ints in 0..{block - 1} "
                f"(drafts verified per step, block size {block}); got {steps!r}"
            )
        out[int(key)] = sorted({x + 1 for x in steps})
    if not out:
        raise ValueError(f'{path}: no batch-size keys; expected e.g. {{"1": {{"candidate_steps": [0, 3, 7, 15]}}}}')
    return out


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


class WidthController:
    """Chooses W per step (see module docstring); `fixed` pins it, `debug_seed` draws it at random,
    `cycle` walks a list by step number (tests: a known width sequence)."""

    def __init__(
        self,
        block: int,
        cost: Optional[CostTable],
        widths_for_bs: Optional[dict] = None,
        fixed: Optional[int] = None,
        debug_seed: Optional[int] = None,
        probe_budget: float = 0.02,
        cycle: Optional[Sequence[int]] = None,
        row_prior: float = 4.0,
        widen_margin: float = 0.0,
    ):
        """widths_for_bs {min_bs: [W, ...]}: the candidates for batches of at least min_bs requests."""
        self.block, self.cost, self.fixed, self.probe_budget = block, cost, fixed, probe_budget
        self.cycle = list(cycle) if cycle else None
        self.widths_for_bs = widths_for_bs or {1: candidate_widths(block)}
        self.keys = sorted(self.widths_for_bs)
        self.accept = {False: AcceptanceStats(block), True: AcceptanceStats(block)}  # keyed by "sampled"
        self.rng = random.Random(debug_seed) if debug_seed is not None else None
        self.since_probe = 0
        self.last_rates: dict = {}
        self.last_choice = (0, 0)
        self.row_stats: dict = {}  # request key -> its own AcceptanceStats (smoothed toward the pooled)
        self.row_prior, self.widen_margin = row_prior, widen_margin
        self.chosen: Counter = Counter()
        self.capped = False  # the last step verified fewer rows than chosen: a request capped it

    @property
    def mode(self) -> str:
        if self.cycle:
            return "cycle"
        return "fixed" if self.fixed is not None else "random" if self.rng is not None else "adaptive"

    def stats(self) -> dict:
        out = {"width_mode": self.mode, "width_steps": {str(w): n for w, n in sorted(self.chosen.items())}}
        if self.cost is not None:  # the start-up profile, ms a step by batch size and width
            c = self.cost
            out["profile_ms"] = {
                str(b): {str(w): round(c.profiled(b, w) * 1e3, 3) for w in c.widths} for b in c.batch_sizes
            }
        return out

    def candidates(self, bs: int) -> list[int]:
        i = max(bisect.bisect_right(self.keys, bs) - 1, 0)
        return self.widths_for_bs[self.keys[i]]

    def rates(self, bs: int, n_sampled: int, rows: Optional[Sequence] = None) -> dict:
        """{W: expected committed tokens per second} for a batch of bs rows, n_sampled of them sampled;
        rows [(request key, sampled)] (optional): each known request's own estimate."""
        if rows is None:  # no request keys: every row at its kind's pooled estimate
            rows = [(None, False)] * (bs - n_sampled) + [(None, True)] * n_sampled
        a_pool = {k: self.accept[k].conditional() for k in (False, True)}
        e_pool = {k: self.accept[k].expected_tokens() for k in (False, True)}
        per_row = [
            self.row_stats[key].expected_tokens(a_pool[kind]) if key in self.row_stats else e_pool[kind]
            for key, kind in rows
        ]
        return {w: sum(e[w] for e in per_row) / max(self.cost(bs, w), 1e-9) for w in self.candidates(bs)}

    def choose(
        self, bs: int, n_sampled: int = 0, step: int = 0, rows: Optional[Sequence] = None, cap: Optional[int] = None
    ) -> int:
        """bs rows, n_sampled of them sampled; step: the first request's verify count (cycle only);
        rows [(request key, sampled)] per row (optional): per-request acceptance; cap: the most rows a
        request of the batch lets a step verify (the widest candidate within it, or 1)."""
        w = self.cycle[step % len(self.cycle)] if self.cycle else self._choose(bs, n_sampled, rows)
        self.capped = cap is not None and w > cap
        if self.capped:
            w = max(x for x in (1, *self.candidates(bs)) if x <= cap)
        self.chosen[w] += 1
        self.last_choice = (bs, n_sampled)
        return w

    def trace(self) -> dict:
        """The last choice's inputs, for the step trace (SGLANG_DFLASH_DEBUG_STEP_TRACE)."""
        bs, n_sampled = self.last_choice
        e = {k: [round(x, 3) for x in self.accept[k].expected_tokens()[1:]] for k in (False, True)}
        return {
            "bs": bs,
            "n_sampled": n_sampled,
            "rates": {str(w): round(r, 2) for w, r in self.last_rates.items()},
            "cost": {str(w): round(self.cost(bs, w), 5) for w in self.candidates(bs)} if self.cost else {},
            "correction": {str(w): round(self.cost.factor(w), 3) for w in self.cost.widths} if self.cost else {},
            "e_greedy": e[False],
            "e_sampled": e[True],
        }

    def _choose(self, bs: int, n_sampled: int, rows: Optional[Sequence] = None) -> int:
        if self.fixed is not None:
            return self.fixed
        cands = self.candidates(bs)
        if self.rng is not None:
            return self.rng.choice(cands)
        if self.cost is None or len(cands) == 1:
            return max(cands)
        rates = self.last_rates = self.rates(bs, n_sampled, rows)
        best = max(cands, key=lambda w: (rates[w], -w))
        if 1 in rates and rates[best] < (1.0 + self.widen_margin) * rates[1]:
            best = 1
        wider = [w for w in cands if w > 1]
        if best != 1 or not wider:
            self.since_probe = 0
            return best
        # W = 1 observes nothing: probe the most promising wider width now and then, spaced so that
        # a probe that accepts nothing costs at most probe_budget of the time.
        self.since_probe += 1
        probe = max(wider, key=lambda w: rates[w])
        plain = self.cost(bs, 1)
        interval = math.ceil((self.cost(bs, probe) - plain) / max(self.probe_budget * plain, 1e-12))
        if self.since_probe >= min(max(interval, 8), 1000):
            self.since_probe = 0
            return probe
        return 1

    def observe(self, width: int, accepted_greedy: Sequence[int], accepted_sampled: Sequence[int]) -> None:
        """After a step: drafts accepted per row, split by kind."""
        for sampled, accepted in ((False, accepted_greedy), (True, accepted_sampled)):
            if not self.capped:  # a step a request capped says nothing of time passing for the others
                self.accept[sampled].age(width)
            if accepted and width > 1:
                self.accept[sampled].update(accepted, width)

    def observe_rows(self, width: int, rows: Sequence, accepted: Sequence[int]) -> None:
        """After a step: rows [(request key, sampled)], accepted[i] drafts accepted by row i. Feeds the
        pooled counts and each request's own; a request not in this step has finished (or left the
        batch) and its counts go."""
        self.observe(
            width, [a for a, (_, s) in zip(accepted, rows) if not s], [a for a, (_, s) in zip(accepted, rows) if s]
        )
        stats = {}
        for (key, _), a in zip(rows, accepted):
            st = stats[key] = self.row_stats.get(key) or AcceptanceStats(self.block, prior_weight=self.row_prior)
            if not self.capped:
                st.age(width)
            if width > 1:
                st.update([a], width)
        self.row_stats = stats

    def observe_cost(self, bs: int, width: int, seconds: float) -> None:
        """A step's measured seconds, all in (the worker adds the scheduler's time up to the next step)."""
        if self.cost is not None:
            self.cost.observe(bs, width, seconds)
