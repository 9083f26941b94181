"""bench/provenance.py's paired ratios and bench/results_headline.py's README headline, on synthetic
rows (no server): three arms give both ratios; runs before the w1 arm keep the two-arm form."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import provenance  # noqa: E402
import results_headline  # noqa: E402
import results_tables  # noqa: E402

KEYS = ("temperature", "seeded", "concurrency")
# tok/s per (arm, repeat): w1 / plain is 2.0 then 3.0, adaptive / w1 is 1.5 then 1.25.
TOK_S = {("plain", 0): 10.0, ("plain", 1): 10.0, ("w1", 0): 20.0, ("w1", 1): 30.0}
TOK_S |= {("adaptive", 0): 30.0, ("adaptive", 1): 37.5}


def raw_runs(arms=("plain", "w1", "adaptive"), cells=((0.0, True, 1), (1.0, False, 4))):
    return [
        {
            "config": arm,
            "repeat": rep,
            **dict(zip(KEYS, cell)),
            "tok_s": TOK_S[(arm, rep)],
            "metas": [{"completion_tokens": 12, "spec_verify_ct": 6 if arm == "adaptive" else 12}],
        }
        for rep in (0, 1)
        for arm in provenance.arm_order(list(arms), rep)
        for cell in cells
    ]


def test_summarize_pairs_each_ratio_within_a_repeat():
    s = provenance.summarize(raw_runs(), KEYS)
    ad, w1, plain = (s[(arm, 0.0, True, 1)] for arm in ("adaptive", "w1", "plain"))
    assert ad["spec_share_runs"] == pytest.approx([1.5, 1.25])  # adaptive / w1, per repeat
    assert (ad["spec_share_min"], ad["spec_share_max"]) == pytest.approx((1.25, 1.5))
    assert ad["cpu_step_runs"] == pytest.approx([2.0, 3.0]) == w1["speedup_runs"]  # w1 / plain
    assert ad["speedup_runs"] == pytest.approx([3.0, 3.75])
    # the mean of paired ratios, not the ratio of means (33.75 / 25 = 1.35)
    assert ad["spec_share"] == pytest.approx(1.375)
    assert plain["spec_share"] is None and w1["spec_share"] is None
    assert s[("adaptive", 1.0, False, 4)]["cpu_step"] == pytest.approx(2.5)


def test_summarize_without_w1_has_no_ratios_to_w1():
    s = provenance.summarize(raw_runs(("plain", "adaptive")), KEYS)
    assert s[("adaptive", 0.0, True, 1)]["cpu_step"] is None and s[("adaptive", 0.0, True, 1)]["spec_share"] is None
    assert s[("adaptive", 0.0, True, 1)]["speedup"] == pytest.approx(3.375)


def test_inline_share_pairs_an_arm_with_its_capped_twin_in_the_same_repeat():
    """real_bench --inline-w1: `adaptive~w1` ran on adaptive's own server, requests capped at width 1."""
    TOK_S.update({("adaptive~w1", 0): 25.0, ("adaptive~w1", 1): 25.0})
    try:
        s = provenance.summarize(raw_runs(("plain", "w1", "adaptive", "adaptive~w1")), KEYS)
    finally:
        del TOK_S[("adaptive~w1", 0)], TOK_S[("adaptive~w1", 1)]
    ad = s[("adaptive", 0.0, True, 1)]
    assert ad["inline_share_runs"] == pytest.approx([1.2, 1.5]) and ad["spec_share_runs"] == pytest.approx([1.5, 1.25])
    assert s[("adaptive~w1", 0.0, True, 1)]["inline_share"] is None and s[("w1", 0.0, True, 1)]["inline_share"] is None


def rows(run, arms, time, **extra):
    """What real_bench.collate writes, reduced to the fields the headline reads."""
    s = provenance.summarize(raw_runs(arms), KEYS)
    out = []
    for (cfg, t, seeded, c), agg in s.items():
        out.append(
            {
                "run": run,
                "config": cfg,
                "temperature": t,
                "seeded": seeded,
                "concurrency": c,
                "requests": 6,
                "max_new_tokens": 128,
                "commit": "abcdef0123",
                "dirty": False,
                "time": time,
                "width_steps": {"1": 3, "4": 1} if cfg == "adaptive" else {},
                **agg,
                **extra,
            }
        )
    return out


def cells_of(lines):
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines if ln.startswith("| ") and "---" not in ln]


def test_headline_three_arms_shows_both_ratios_and_the_eos_policy():
    rs = rows("new", ("plain", "w1", "adaptive"), "2026-12-07T00:00", ignore_eos=True, sched_matched=False)
    rs += rows("old", ("plain", "adaptive"), "2026-12-01T00:00")
    lines, shown = results_headline.headline(rs, "ship0")
    head, *body = cells_of(lines)
    col = {name: i for i, name in enumerate(head)}
    assert "our CPU step (w1/plain)" in col and "speculation's own share (adaptive/w1)" in col
    t0, t1 = body  # T=0 seeded, then T=1 unseeded
    assert t0[col["our CPU step (w1/plain)"]] == "2.50x (2.00-3.00)"
    assert t0[col["speculation's own share (adaptive/w1)"]] == "1.38x (1.25-1.50)"
    assert (t0[col["plain tok/s"]], t0[col["w1 tok/s"]], t0[col["adaptive tok/s"]]) == ("10.0", "25.0", "33.8")
    assert t0[col["tau"]] == "2.00" and t1[col["T"]] == "1 unseeded"
    assert {r["run"] for r in shown} == {"new"}  # the two-arm run is not mixed in
    text = "\n".join(lines)
    assert "EOS ignored" in text and "plain with SGLang's defaults" in text


def test_headline_falls_back_to_two_arms_before_any_w1_run():
    rs = rows("old", ("plain", "adaptive"), "2026-12-01T00:00")
    rs = [{**r, "temperature": 1.0 if r["temperature"] else 0.0} for r in rs]
    lines, shown = results_headline.headline(rs, "ship0")
    head, *body = cells_of(lines)
    assert "DFLASH tok/s" in head and "our CPU step (w1/plain)" not in head
    assert len(body) == 2 and {r["config"] for r in shown} == {"plain", "adaptive"}
    assert "Not measured with the weights shipped at `ship0`" in lines[-1]


def test_headline_shows_a_dash_for_a_cell_the_w1_arm_missed():
    rs = rows("new", ("plain", "w1", "adaptive"), "2026-12-07T00:00")
    rs = [r for r in rs if not (r["config"] == "w1" and r["temperature"] == 1.0)]
    for r in rs:
        if r["temperature"] == 1.0:
            r["cpu_step"] = r["spec_share"] = None
    head, *body = cells_of(results_headline.headline(rs, None)[0])
    t1 = body[1]
    assert t1[head.index("w1 tok/s")] == "-" and t1[head.index("our CPU step (w1/plain)")] == "-"


def test_a_sched_arm_is_its_base_with_dflashs_scheduler_flags():
    draft, flags, environ = provenance.arm("plain-sched", "unused", ["--enable-metrics"], False)
    assert draft is None and environ == {}
    assert flags == ["--enable-metrics", *provenance.SCHED_FLAGS]
    assert provenance.arm("plain", "unused", ["--enable-metrics"], False)[1] == ["--enable-metrics"]


def test_a_margin_arm_sets_the_controllers_widen_margin():
    import sglang_dflash

    shipped = os.path.join(os.path.dirname(sglang_dflash.__file__), "drafters", "smollm2-135m-instruct-dflash")
    draft, flags, environ = provenance.arm("adaptive-margin0.1", shipped, [], False)
    assert environ == {"SGLANG_DFLASH_WIDEN_MARGIN": "0.1"} and draft == shipped
    assert provenance.arm("adaptive-margin0", shipped, [], False)[2] == {"SGLANG_DFLASH_WIDEN_MARGIN": "0"}
    with pytest.raises(SystemExit, match="unknown arm"):
        provenance.arm("adaptive-marginx", shipped, [], False)


def test_bf16_match_reports_each_first_divergence_and_its_gap():
    from bf16_match import compare

    plain = [
        {"ids": [1, 2, 3], "gap": [2.0, 0.06, 1.0], "runner_up": [9, 7, 9]},
        {"ids": [4, 5, 6], "gap": [1.0, 1.0, 0.5], "runner_up": [9, 9, 8]},
        {"ids": [1, 1, 1], "gap": [1.0, 1.0, 1.0], "runner_up": [2, 2, 2]},
    ]
    got = compare(plain, [[1, 7, 0], [4, 5, 0], [1, 1, 1]])
    assert got["identical"] == 1 and got["prompts"] == 3
    assert got["diverged_at"] == [1, 2] and got["first_gap"] == [0.06, 0.5]
    assert got["runner_up_taken"] == 1  # the second one's token is not plain's runner-up
    plain[1]["top"] = [{}, {}, {6: 0.0, 8: 0.5}]
    plain[0]["top"] = [{}, {2: 0.0, 7: 0.06}, {}]
    got = compare(plain, [[1, 7, 0], [4, 5, 0], [1, 1, 1]])
    assert got["first_token_below_best"] == [0.06, None] and got["within_tie"] == 1


def test_the_day_mix_covers_every_kind_and_counts_kill_errors_apart():
    import random

    from soak_mix import BAD, KINDS, classify, plan

    jobs = plan(2000, [[5, 6, 7], [8, 9]], random.Random(0))
    seen = {j["kind"] for j in jobs}
    assert seen == set(KINDS)
    bad = [j for j in jobs if j["kind"] == "bad"]
    assert {json.dumps(j["body"]["sampling_params"]) for j in bad} == {json.dumps(b["sampling_params"]) for b in BAD}
    assert all(1 <= j["max_new"] <= 256 for j in jobs)
    results = [
        {"i": 0, "kind": "greedy", "status": "completed", "start": 0.0, "end": 5.0},
        {"i": 1, "kind": "greedy", "status": "error", "error": "http502: x", "start": 9.0, "end": 11.0},  # in flight
        {"i": 2, "kind": "stream", "status": "error", "error": "http500: y", "start": 40.0, "end": 41.0},  # not
        {"i": 3, "kind": "bad", "status": "refused", "start": 1.0, "end": 1.1},
    ]
    got = classify(jobs[:5], results, {"kill": 10.0})
    assert (got["completed"], got["refused"], got["errors_at_kill"], got["errors_other"]) == (1, 1, 1, 1)
    assert got["lost"] == 1 and got["by_kind"]["greedy"] == {"completed": 1, "error": 1}


def test_sampled_walk_table_holds_dflash1_and_dflash2_rows_side_by_side():
    """DFlash 1 rows walk argmax / q1 / qall, DFlash 2 rows argmax / path: one table, a dash where a
    drafter has no such rule."""
    one = {"T0": {"argmax": {"16": 1.6}}, "T1": {"argmax": {"16": 1.49}, "q1": {"16": 1.51}, "qall": {"16": 1.52}}}
    two = {"T0": {"argmax": {"16": 1.68}}, "T1": {"argmax": {"16": 1.54}, "path": {"16": 1.58}}}
    rows = [
        {"name": n, "heldout_set": "unseen", "heldout": 216, "block": 16, "sampled_walk": sw}
        for n, sw in (("parent", one), ("dflash2-long", two))
    ]
    text = "\n".join(results_tables.sampled_walks(rows))
    assert "| T1 argmax | T1 q1 | T1 qall | T1 path |" in text
    assert "| parent | unseen (216) | 1.600 | 1.490 | 1.510 | 1.520 | - |" in text
    assert "| dflash2-long | unseen (216) | 1.680 | 1.540 | - | - | 1.580 |" in text


def test_width_trace_summary_splits_kinds_and_drops_idle_gaps(tmp_path):
    """bench/width_trace.py: a step's all-in time arrives with the next step; a gap far longer than
    the step's stages is an idle wait between rows, not a step; rows are split greedy / sampled."""
    import width_trace

    def step(prev, w, n_sampled, commits):
        rates = {str(w): sum(commits) / 0.02}
        return {"prev_all_in": prev, "W": w, "bs": 2, "n_sampled": n_sampled, "commits": commits,
                "stages": {"verify": 0.02}, "rates": rates, "cost": {str(w): 0.02}}  # fmt: skip

    steps = [step(None, 2, 0, [2, 1]), step(0.025, 2, 0, [1, 1]), step(3.0, 1, 2, [1, 1]), step(0.021, 1, 2, [1, 1])]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in steps))
    (only,) = width_trace.load(str(path)).values()
    assert [s["all_in"] for s in only] == [0.025, 0.021]  # the 3 s gap is left out, the last has no next
    rows = {(r["kind"], r["W"]): r for r in width_trace.summarize(only)}
    assert set(rows) == {("greedy", 2), ("sampled", 1)}
    assert rows[("greedy", 2)]["tok_s"] == pytest.approx(3 / 0.025) and rows[("greedy", 2)]["exp_tok_step"] == 3
