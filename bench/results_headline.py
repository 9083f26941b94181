"""The README's headline table (bench/results_page.py writes it between its markers) from real_bench
rows, already narrowed to runs that served the shipped drafter.

Three-arm form, from the newest run with `plain`, `w1` and `adaptive` rows at T=0 and T>0: per temperature (seeded
and unseeded) and concurrency, the three arms' tok/s and the two paired ratios a reader asks for
first: our CPU step (w1 / plain) and speculation's own share (adaptive / w1). Until such a run exists
the older two-arm form (plain against adaptive, newest run per cell) stays, so README and the rows
agree at every commit.
"""

from __future__ import annotations

from results_tables import f1, f2, runs, spread, table, widths

ARMS = ("plain", "w1", "adaptive")
LEGACY_CELLS = [(t, c) for t in (0.0, 1.0) for c in (1, 4, 16, 32)]


def headline(rs: list[dict], ship: str | None, weights: str = "") -> tuple[list[str], list[dict]]:
    """(markdown lines, the rows it shows) for real_bench rows `rs` (shipped drafter only); `weights`:
    the drafter's weights file, named when a run measured them uncommitted."""
    # a full run: all three arms, greedy and sampled rows (a T=0-only check run does not replace it)
    newest = next(
        (
            g
            for g in runs(rs).values()
            if set(ARMS) <= {r["config"] for r in g} and len({r["temperature"] > 0 for r in g}) == 2
        ),
        None,
    )
    return three_arm(newest, ship, weights) if newest else legacy(rs, ship, weights)


def temp_label(r: dict) -> str:
    """`0`, `1` (seeded requests), `1 unseeded`; rows older than the seeded field were seeded."""
    return f"{r['temperature']:g}" + (" unseeded" if r["temperature"] > 0 and r.get("seeded") is False else "")


def ratio(r: dict | None, key: str) -> str | None:
    """A paired ratio with its min-max, or None (rendered `-`) when the run lacks an arm for it."""
    return spread(r, key, f2, "x") if r and r.get(key) is not None else None


def run_line(d: dict, ship: str | None, weights: str) -> str:
    """How a run measured: commit, time, tokens, EOS policy, repeats, the plain arm's scheduler."""
    eos = "EOS ignored: every arm decodes exactly that many" if d.get("ignore_eos") else "stopping at EOS"
    how = f"commit `{d['commit'][:7]}`, measured {d['time'][:16]}, {d['max_new_tokens']} new tokens ({eos})"
    how += f", {d['repeats']} repeats ABBA"
    if "cpu_step" in d:  # three-arm runs say which scheduler plain had
        how += "; plain with DFLASH's scheduler flags" if d.get("sched_matched") else "; plain with SGLang's defaults"
    if weights in (d.get("dirty_files") or []):
        how += f"; dirty: the drafter weights, uncommitted then, committed next as `{ship}`"
    return f"- `{d['run']}`: {how}."


def host_line(d: dict) -> str | None:
    h = d.get("host") or {}
    bw = h.get("bandwidth") or {}
    if not h.get("isa") or "read_gbs_1core" not in bw:
        return None
    peak = next((f"; {bw[k]:.0f} GFLOP/s of {n} on all" for k, n in PEAKS if bw.get(k)), "")
    return (
        f"- host: {h.get('cores')} cores of {h.get('cpu')} ({', '.join(h['isa'])}); memory read "
        f"{bw['read_gbs_1core']} GB/s on one core, {bw['read_gbs_all']} GB/s on {bw['read_gbs_threads']}{peak}."
    )


# the arithmetic peak a host line names (bench/host_probe.py): the bf16 dot products where measured
PEAKS = (("dot_gflops_all", "bf16 dot products"), ("fma_gflops_all", "fp32 FMAs"))


def three_arm(rs: list[dict], ship: str | None, weights: str = "") -> tuple[list[str], list[dict]]:
    cells: dict[tuple, dict[str, dict]] = {}
    for r in rs:
        if r["config"] in ARMS:
            cells.setdefault((r["temperature"], r.get("seeded") is not False, r["concurrency"]), {})[r["config"]] = r
    head = ["T", "concurrency", "requests", "plain tok/s", "w1 tok/s", "adaptive tok/s"]
    head += ["our CPU step (w1/plain)", "speculation's own share (adaptive/w1)", "adaptive/plain", "tau"]
    head += ["verify widths", "run"]
    body, shown = [], []
    for key in sorted(cells, key=lambda k: (k[0], not k[1], k[2])):
        got = cells[key]
        p, w, d = (got.get(k) for k in ARMS)
        if d is None:
            continue
        body.append(
            [temp_label(d), d["concurrency"], d["requests"]]
            + [f1(x["tok_s"]) if x else None for x in (p, w, d)]
            + [ratio(d, "cpu_step"), ratio(d, "spec_share"), ratio(d, "speedup"), f2(d["tau"]), widths(d)]
            + [f"`{d['run']}`{' (dirty)' if d.get('dirty') else ''}"]
        )
        shown += [x for x in (p, w, d) if x]
    d0 = shown[0] if shown else rs[0]
    lines = table(head, body) + ["", run_line(d0, ship, weights)]
    lines += [x for x in [host_line(d0)] if x]
    return lines, shown


def legacy(rs: list[dict], ship: str | None, weights: str = "") -> tuple[list[str], list[dict]]:
    """plain against adaptive, the newest run per (T, concurrency) cell (runs before the w1 arm)."""
    cells, missing = [], []
    for t, c in LEGACY_CELLS:
        by_run = runs([r for r in rs if r["temperature"] == t and r["concurrency"] == c])
        pick = next((g for g in by_run.values() if {"plain", "adaptive"} <= {r["config"] for r in g}), None)
        if pick is None:
            missing.append(f"T={t:g} c={c}")
            continue
        plain, dfl = (next(r for r in pick if r["config"] == k) for k in ("plain", "adaptive"))
        cells.append((t, c, plain, dfl))
    body = [
        [f"{t:g}", c, d["requests"], f1(p["tok_s"]), f1(d["tok_s"]), spread(d, "speedup", f2, "x"), f2(d["tau"])]
        + [widths(d)]
        + [f"`{d['run']}`{' (dirty)' if d.get('dirty') else ''}"]
        for t, c, p, d in cells
    ]
    head = ["T", "concurrency", "requests", "plain tok/s", "DFLASH tok/s", "speedup (min-max)", "tau", "verify widths"]
    head.append("run")
    lines = table(head, body) + [""]
    for run, d in {d["run"]: d for *_, d in cells}.items():
        how = f"commit `{d['commit'][:7]}`, measured {d['time'][:16]}, {d['max_new_tokens']} new tokens"
        how += f", {d['repeats']} repeats ABBA" + ", --ignore-eos" * bool(d.get("ignore_eos"))
        if weights in (d.get("dirty_files") or []):
            how += f"; dirty: the drafter weights, uncommitted then, committed next as `{ship}`"
        lines.append(f"- `{run}`: {how}.")
    lines += ["", f"Not measured with the weights shipped at `{ship}`: {', '.join(missing) or 'none'}."]
    return lines, [d for *_, d in cells] + [p for _, _, p, _ in cells]
