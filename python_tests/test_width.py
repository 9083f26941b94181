"""The verify-width controller (pipeline/width.py), without a server."""

import json
import random

import pytest

from sglang_dflash.pipeline.step_cost import CostTable
from sglang_dflash.pipeline.width import (
    AcceptanceStats,
    WidthController,
    candidate_widths,
    load_width_config,
)

WIDTHS = [1, 2, 4, 8, 16]


def linear_costs(sizes, widths, fixed=1.0, per_row=0.1, draft=0.5):
    """A CPU-like step: cost grows with the rows verified; W > 1 adds a draft forward."""
    return {(bs, w): fixed + per_row * bs * w + (draft if w > 1 else 0.0) for bs in sizes for w in widths}


def simulate(ctl, accept_p, bs=1, steps=400, seed=0):
    """Run the controller against rows whose drafts are each accepted with probability accept_p
    (a float, or a list: P(draft j accepted | drafts before it were) at index j - 1);
    -> tokens committed per second of (modelled) step time."""
    rng = random.Random(seed)
    p_at = accept_p if isinstance(accept_p, list) else [accept_p] * 16
    tokens = seconds = 0.0
    for _ in range(steps):
        w = ctl.choose(bs)
        acc = []
        for _ in range(bs):
            a = 0
            while a < w - 1 and rng.random() < p_at[a]:
                a += 1
            acc.append(a)
        ctl.observe(w, acc, [])
        ctl.observe_cost(bs, w, ctl.cost.profiled(bs, w) if ctl.cost else 1.0)
        tokens += bs + sum(acc)
        seconds += ctl.cost.profiled(bs, w) if ctl.cost else 1.0
    return tokens / seconds


def best_width(accept_p, cost, bs):
    """Brute force: expected tokens per second for geometric acceptance."""

    def rate(w):
        return bs * sum(accept_p**k for k in range(w)) / cost(bs, w)

    return max(WIDTHS, key=rate), rate


def test_expected_tokens_follow_the_observed_acceptance():
    st = AcceptanceStats(16, prior_weight=1e-6)
    st.update([3] * 50, width=16)  # every row: drafts 1..3 accepted, draft 4 rejected
    e = st.expected_tokens()
    assert e[1] == 1.0 and e[4] == pytest.approx(4.0, abs=1e-3)
    assert e[16] == pytest.approx(4.0, abs=1e-3)  # nothing past position 4 is ever accepted
    st2 = AcceptanceStats(16, prior_weight=1e-6)
    st2.update([15] * 10, width=16)
    assert st2.expected_tokens()[16] == pytest.approx(16.0, abs=1e-3)


def test_a_narrow_width_does_not_count_its_cut_as_a_rejection():
    st = AcceptanceStats(16, prior_weight=1e-6)
    st.update([3] * 50, width=4)  # all 3 verified drafts accepted; positions 4.. were never verified
    a = st.conditional()
    assert a[3] == pytest.approx(1.0) and st.reach[4] == 0
    assert a[4] == pytest.approx(1.0)  # an unverified position borrows its neighbour's estimate


def test_counts_decay_to_a_recent_window():
    st = AcceptanceStats(8, half_life=4, prior_weight=1e-6)
    st.update([7] * 10, width=8)
    for _ in range(40):
        st.age(8)
        st.update([0] * 10, width=8)
    assert st.conditional()[1] < 0.01


def test_a_narrow_width_keeps_what_a_wider_probe_measured():
    st = AcceptanceStats(16, half_life=4, prior_weight=1e-6)
    st.update([3] * 20 + [7] * 20, width=16)  # positions 4.. measured: half the rows stop at 4
    a4 = st.conditional()[4]
    for _ in range(100):
        st.age(4)
        st.update([3] * 10, width=4)
    assert st.conditional()[4] == pytest.approx(a4)


def test_cost_table_is_forced_monotone_and_interpolates():
    sizes = [1, 4, 16]
    secs = linear_costs(sizes, WIDTHS)
    secs[(4, 8)] = 0.1  # a noisy measurement below its neighbours
    secs[(16, 2)] = 0.1
    t = CostTable(sizes, WIDTHS, secs)
    for bs in sizes:
        row = [t(bs, w) for w in WIDTHS]
        assert row == sorted(row), row
    for w in WIDTHS:
        col = [t(bs, w) for bs in sizes]
        assert col == sorted(col), col
    assert t(2, 4) == pytest.approx(t(1, 4) + (t(4, 4) - t(1, 4)) / 3)
    assert t(32, 16) > t(16, 16)  # extrapolated beyond the largest profiled batch
    before = t(16, 16)
    for _ in range(100):
        t.observe(16, 16, 2 * before)  # real steps take twice the profile: the estimate follows
    assert t(16, 16) == pytest.approx(2 * before, rel=0.01)


@pytest.mark.parametrize("accept_p,bs", [(0.0, 1), (0.0, 16), (0.5, 1), (0.5, 16), (0.9, 1), (0.95, 16), (1.0, 16)])
def test_controller_settles_on_the_best_width(accept_p, bs):
    sizes = [1, 4, 16]
    cost = CostTable(sizes, WIDTHS, linear_costs(sizes, WIDTHS))
    ctl = WidthController(16, cost)
    got = simulate(ctl, accept_p, bs=bs, steps=2000)
    want, rate = best_width(accept_p, cost, bs)
    # within 7% of the best fixed width in hindsight, exploration and estimation noise included
    assert got >= 0.93 * rate(want), (accept_p, bs, got, want, rate(want), ctl.chosen)


def test_depth_dependent_acceptance_settles_without_wasting_wide_steps():
    """Acceptance like the shipped drafter's: fair for the first drafts, then collapsing. The
    controller must not keep returning to a wider width whose extra positions it has measured
    (neighbour smoothing is optimistic about positions it has not); only budgeted probes go wider."""
    sizes = [1, 4, 16]
    cost = CostTable(sizes, WIDTHS, linear_costs(sizes, WIDTHS, fixed=1.0, per_row=0.03, draft=0.1))
    accept = [0.4, 0.6, 0.6, 0.5, 0.2] + [0.0] * 11
    for bs in (1, 4):
        ctl = WidthController(16, cost)
        got = simulate(ctl, accept, bs=bs, steps=3000, seed=bs)

        def rate(w):
            e, run = 1.0, 1.0
            for p in accept[: w - 1]:
                run *= p
                e += run
            return bs * e / cost(bs, w)

        best = max(WIDTHS, key=rate)
        assert got >= 0.97 * rate(best), (bs, got, best, rate(best), ctl.chosen)
        assert ctl.chosen[best] >= 0.85 * 3000, (bs, best, ctl.chosen)


def test_width_one_probes_again_and_recovers():
    """After a stretch of rejections the controller plays plain decoding, probes every so often
    (a bounded share of the time), and widens again once the drafts are good."""
    sizes = [1, 4, 16]
    cost = CostTable(sizes, WIDTHS, linear_costs(sizes, WIDTHS))
    ctl = WidthController(16, cost)
    simulate(ctl, 0.0, bs=4, steps=300)
    assert ctl.chosen[1] > 0.8 * 300
    probes = sum(n for w, n in ctl.chosen.items() if w > 1)
    assert 0 < probes
    simulate(ctl, 1.0, bs=4, steps=300)
    assert ctl.choose(4) == 16


def test_fixed_random_and_cycle_modes():
    assert {WidthController(16, None, fixed=4).choose(8) for _ in range(10)} == {4}
    ctl = WidthController(16, None, debug_seed=3)
    assert {ctl.choose(8) for _ in range(200)} == set(WIDTHS)
    ctl = WidthController(16, None, cycle=[16, 1, 1])
    assert [ctl.choose(1, step=s) for s in range(6)] == [16, 1, 1, 16, 1, 1]
    assert WidthController(16, None).choose(4) == 16  # no cost table: verify the whole block


def test_a_request_cap_bounds_every_mode_to_a_candidate():
    """cap: the widest candidate within it (1 is always one); counted as the width played."""
    fixed = WidthController(16, None, fixed=16)
    assert [fixed.choose(4, cap=c) for c in (1, 2, 3, 7, 8, 15, 16, 99, None)] == [1, 2, 2, 4, 8, 8, 16, 16, 16]
    assert fixed.chosen == {1: 1, 2: 2, 4: 1, 8: 2, 16: 3}
    table = {1: [4, 16]}  # a candidate list without 1: a cap below 4 still decodes plainly
    assert WidthController(16, None, table, fixed=16).choose(2, cap=3) == 1
    assert {WidthController(16, None, debug_seed=s).choose(8, cap=1) for s in range(20)} == {1}


def test_a_capped_stretch_keeps_what_the_controller_learnt():
    """Steps a request capped to width 1 age nothing; the controller's own width-1 steps do."""
    sizes = [1, 4, 16]
    cost = CostTable(sizes, WIDTHS, linear_costs(sizes, WIDTHS))
    ctl = WidthController(16, cost)
    simulate(ctl, 0.9, bs=4, steps=200)  # learns a high acceptance: it wants wide steps
    learnt = ctl.accept[False].expected_tokens()
    rows = [(k, False) for k in "abcd"]
    for _ in range(300):
        assert ctl.choose(4, rows=rows, cap=1) == 1 and ctl.capped
        ctl.observe_rows(1, rows, [0, 0, 0, 0])
    assert ctl.accept[False].expected_tokens() == learnt
    for _ in range(300):
        ctl.choose(4, rows=rows)  # not capped: a width-1 step ages the counts toward the prior
        ctl.observe_rows(1, rows, [0, 0, 0, 0])
    assert ctl.accept[False].expected_tokens()[16] < learnt[16] - 1.0


def test_candidates_by_batch_size_bound_the_choice(tmp_path):
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps({"1": {"candidate_steps": [0, 3, 15]}, "8": {"candidate_steps": [0, 1]}}))
    table = load_width_config(str(path), 16)
    assert table == {1: [1, 4, 16], 8: [1, 2]}
    ctl = WidthController(16, None, table, debug_seed=0)
    assert {ctl.choose(4) for _ in range(100)} == {1, 4, 16}
    assert {ctl.choose(32) for _ in range(100)} == {1, 2}
    assert candidate_widths(16) == WIDTHS and candidate_widths(6) == [1, 2, 4, 6]


@pytest.mark.parametrize(
    "cfg,msg",
    [
        ({"1": {"candidate_steps": [16]}}, "0..15"),
        ({"1": {"candidate_steps": []}}, "candidate_steps"),
        ({"tiers": {}}, "no batch-size keys"),
    ],
)
def test_bad_width_config_names_the_field(tmp_path, cfg, msg):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=msg):
        load_width_config(str(path), 16)


def run_requests(ctl, accept_p, length=128, seed=0, per_row=True):
    """Requests of `length` tokens each, request i's drafts accepted with probability accept_p[i],
    all started together (the batch shrinks as they finish); -> modelled seconds to finish all."""
    rng = random.Random(seed)
    left = {f"r{i}": length for i in range(len(accept_p))}
    p = {f"r{i}": q for i, q in enumerate(accept_p)}
    seconds = 0.0
    while left:
        keys = sorted(left)
        rows = [(k, False) for k in keys]
        w = ctl.choose(len(keys), rows=rows if per_row else None)
        acc = []
        for k in keys:
            a = 0
            while a < w - 1 and rng.random() < p[k]:
                a += 1
            acc.append(a)
            left[k] -= a + 1
        if per_row:
            ctl.observe_rows(w, rows, acc)
        else:
            ctl.observe(w, acc, [])
        seconds += ctl.cost.profiled(len(keys), w)
        left = {k: n for k, n in left.items() if n > 0}
    return seconds


def test_per_request_acceptance_narrows_the_slow_tail():
    """Seven requests that accept most drafts beside one that accepts almost none: the slow one is
    left alone at the end. Pooled counts alone keep verifying wide blocks for it (its neighbours'
    acceptance is still in the window); its own counts turn the tail to plain decoding."""
    sizes = [1, 4, 16]
    cost = CostTable(sizes, WIDTHS, linear_costs(sizes, WIDTHS, fixed=1.0, per_row=0.05, draft=0.3))
    accept = [0.9] * 7 + [0.02]
    pooled = run_requests(WidthController(16, cost), accept, per_row=False)
    per_row = run_requests(WidthController(16, cost), accept, per_row=True)
    print(f"modelled seconds: pooled {pooled:.1f}, per request {per_row:.1f}")
    assert per_row < 0.85 * pooled, (per_row, pooled)
    for same in ([0.6] * 8, [0.9] * 8, [0.0] * 8):  # alike requests: no worse than pooled counts
        mine = sum(run_requests(WidthController(16, cost), same, seed=s) for s in range(5))
        assert mine <= 1.03 * sum(
            run_requests(WidthController(16, cost), same, seed=s, per_row=False) for s in range(5)
        )
    ctl = WidthController(16, cost)
    ctl.observe_rows(8, [("a", False), ("b", True)], [7, 0])
    ctl.observe_rows(8, [("b", True)], [1])  # "a" finished: its counts go
    assert set(ctl.row_stats) == {"b"}


def test_a_width_never_run_borrows_the_observed_correction():
    """A start-up profile taken on a slow stretch of the host (every cell 2x the real step): the
    widths that run get corrected, and width 1, which would never run under a wrong profile, must
    not keep its inflated cost (that made the controller speculate at a loss under load)."""
    sizes = [1, 4, 16]
    true = linear_costs(sizes, WIDTHS, fixed=1.0, per_row=0.01, draft=0.1)
    cost = CostTable(sizes, WIDTHS, {k: 2 * v for k, v in true.items()})
    assert cost.factor(1) == 1.0  # nothing observed yet: the profile as measured
    for _ in range(60):
        cost.observe(16, 4, true[(16, 4)])
        cost.observe(16, 8, true[(16, 8)] * 0.8)
    assert cost.factor(4) == pytest.approx(0.5, rel=0.02) and cost.factor(8) == pytest.approx(0.4, rel=0.02)
    assert cost.factor(1) == pytest.approx((0.5 * 0.4) ** 0.5, rel=0.02)  # the observed ones' (log) mean
    # Steps nearly as cheap at every width (a GPU-like batch): the inflated width 1 then loses to a
    # corrected width 16 even when no draft is ever accepted, unless it borrows the correction.
    true = linear_costs(sizes, WIDTHS, fixed=1.0, per_row=0.001, draft=0.02)
    ctl = WidthController(16, CostTable(sizes, WIDTHS, {k: 2 * v for k, v in true.items()}))
    for accept, settle in ((True, 100), (False, 200)):  # every draft accepted, then none
        for i in range(settle + 300):
            if i == settle:
                ctl.chosen.clear()
            w = ctl.choose(16)
            ctl.observe(w, [w - 1 if accept else 0] * 16 if w > 1 else [], [])
            ctl.observe_cost(16, w, true[(16, w)])
        assert ctl.chosen[16 if accept else 1] > 0.8 * 300, (accept, ctl.chosen)  # without borrowing: 0


@pytest.mark.parametrize("a1,want", [(0.55, 1), (0.65, 2)])
def test_speculating_must_beat_plain_decoding_by_the_margin(a1, want):
    """Width 2 at 1.5x the cost of width 1 pays when draft 1 is accepted more than half the time.
    With a 5% margin, estimated 3% ahead (a1 = 0.55) plays plain decoding and 10% ahead (a1 = 0.65)
    speculates; without one (the default) the top estimate wins however close."""
    sizes = [1, 16]
    cost = CostTable(sizes, [1, 2], {(b, w): (1.0 if w == 1 else 1.5) * b for b in sizes for w in (1, 2)})
    ctl = WidthController(16, cost, widths_for_bs={1: [1, 2]}, widen_margin=0.05)
    st = ctl.accept[False] = AcceptanceStats(16, prior_weight=1e-6)
    st.update([1] * round(a1 * 1000) + [0] * round((1 - a1) * 1000), width=2)
    rates = ctl.rates(16, 0)
    assert rates[2] / rates[1] == pytest.approx((1 + a1) / 1.5, rel=1e-3)
    assert ctl.choose(16) == want
    plain = WidthController(16, cost, widths_for_bs={1: [1, 2]})
    plain.accept[False] = st
    assert plain.choose(16) == 2  # no margin: the top estimate, however close


def test_calibration_scales_the_expected_gain_by_what_wide_steps_accepted():
    """GainCalibration: accepted over expected drafts per kind of row, prior 1, clamped; the
    controller scales E(W) - 1 by it, feeds it each wide step, and plain steps age it back to 1."""
    from sglang_dflash.pipeline.acceptance import GainCalibration

    g = GainCalibration()
    assert g.factor(True) == g.factor(False) == 1.0
    for _ in range(50):
        g.observe(True, expected=10.0, accepted=5.0)
    assert g.factor(True) == pytest.approx(0.5, abs=0.01) and g.factor(False) == 1.0
    for _ in range(200):
        g.observe(True, expected=10.0, accepted=0.0)
    assert g.factor(True) == 0.25  # clamped
    for _ in range(2000):
        g.age()
    assert g.factor(True) == pytest.approx(1.0, abs=0.02)

    sizes = [1, 4, 16]
    cost = CostTable(sizes, WIDTHS, linear_costs(sizes, WIDTHS))
    ctl, raw = WidthController(16, cost), WidthController(16, cost, calibrate=False)
    rows = [("a", True), ("b", True)]
    ctl.gain.expected[True], ctl.gain.accepted[True] = 96.0, 46.0  # factor (46 + 4) / (96 + 4) = 0.5
    for w in (2, 4, 16):
        gain_cal = ctl.rates(2, 2, rows)[w] * cost(2, w) - 2
        assert gain_cal == pytest.approx(0.5 * (raw.rates(2, 2, rows)[w] * cost(2, w) - 2))
    ctl.gain.expected[True] = ctl.gain.accepted[True] = 10.0  # factor 1
    w = ctl.choose(2, 2, rows=rows)
    assert w > 1 and ctl.pending[0] == w  # the prior (0.6) makes widening worth a try
    expected = ctl.pending[1][True]
    ctl.observe_rows(w, rows, [1, 0])
    assert ctl.gain.expected[True] == pytest.approx(10.0 * ctl.gain.decay + expected)
    assert ctl.gain.accepted[True] == pytest.approx(10.0 * ctl.gain.decay + 1)


def test_calibration_costs_little_where_its_one_factor_fits_no_phase():
    """Requests that accept most drafts early and few later: one factor per kind of row, learnt
    over both phases, fits neither; the per-request counts follow the fall by themselves. The
    calibrated controller must stay within 3% of the uncalibrated one there."""
    sizes = [1, 4, 16]
    cost = CostTable(sizes, WIDTHS, linear_costs(sizes, WIDTHS, fixed=1.0, per_row=0.03, draft=0.1))

    def run(ctl, seed):
        rng, seconds, tokens = random.Random(seed), 0.0, 0
        for _ in range(12):  # 12 requests of 96 tokens, one after another
            done, key = 0, f"r{rng.random()}"
            while done < 96:
                w = ctl.choose(1, 1, rows=[(key, True)])
                p = 0.7 if done < 24 else 0.15
                a = 0
                while a < w - 1 and rng.random() < p:
                    a += 1
                ctl.observe_rows(w, [(key, True)], [a])
                seconds += ctl.cost.profiled(1, w)
                done += a + 1
                tokens += a + 1
        return tokens / seconds

    cal = sum(run(WidthController(16, cost), s) for s in range(4))
    raw = sum(run(WidthController(16, cost, calibrate=False), s) for s in range(4))
    print(f"modelled tokens/s, calibrated {cal:.3f} against {raw:.3f}")
    assert cal > 0.97 * raw
