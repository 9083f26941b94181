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

from sglang_dflash.pipeline.acceptance import AcceptanceStats, GainCalibration
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
        calibrate: bool = True,
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
        self.gain = GainCalibration() if calibrate else None
        self.last_rows: Optional[list] = None  # [(sampled, E per width)] of the last rates(), uncalibrated
        self.last_width = 0  # the width the last choose() returned

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
        self.last_rows = list(zip([kind for _, kind in rows], per_row))  # uncalibrated: what calibration checks
        g = {k: self.gain.factor(k) if self.gain else 1.0 for k in (False, True)}
        return {
            w: sum(1.0 + g[kind] * (e[w] - 1.0) for kind, e in self.last_rows) / max(self.cost(bs, w), 1e-9)
            for w in self.candidates(bs)
        }

    def choose(
        self, bs: int, n_sampled: int = 0, step: int = 0, rows: Optional[Sequence] = None, cap: Optional[int] = None
    ) -> int:
        """bs rows, n_sampled of them sampled; step: the first request's verify count (cycle only);
        rows [(request key, sampled)] per row (optional): per-request acceptance; cap: the most rows a
        request of the batch lets a step verify (the widest candidate within it, or 1)."""
        self.last_rows = None
        w = self.cycle[step % len(self.cycle)] if self.cycle else self._choose(bs, n_sampled, rows)
        self.capped = cap is not None and w > cap
        if self.capped:
            w = max(x for x in (1, *self.candidates(bs)) if x <= cap)
        self.chosen[w] += 1
        self.last_choice = (bs, n_sampled)
        self.last_width = w
        return w

    @property
    def pending(self) -> Optional[tuple]:
        """(W, {kind: drafts expected}) of the step chosen last, what calibration checks it against;
        None when it was not chosen from rates (pinned, random, cycled) or decodes plainly."""
        if self.gain is None or self.last_rows is None or self.last_width <= 1:
            return None
        w = self.last_width
        return w, {k: sum(e[w] - 1.0 for kind, e in self.last_rows if kind == k) for k in (False, True)}

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
            "gain": [round(self.gain.factor(k), 3) for k in (False, True)] if self.gain else [],
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
        if self.gain is not None and not self.capped:
            self.gain.age()
        pending = self.pending
        if pending is not None and pending[0] == width:
            for kind, accepted in ((False, accepted_greedy), (True, accepted_sampled)):
                if accepted:
                    self.gain.observe(kind, pending[1][kind], sum(accepted))
        self.last_rows = None  # observed once
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
