"""Tables of how a server shares its host, holds a day of traffic and matches plain in bf16, and what a
decode step costs by width: two servers side by side (bench/shared_host.py), a day of traffic behind
SMG (bench/soak_day.py), bf16 greedy against plain (bench/bf16_match.py), the start-up step-cost
table per checkout (bench/profile_table.py) and the drafter's block cut to the verify width
(bench/draft_block.py)."""

from __future__ import annotations

from results_tables import rows, runs, table


def shared_host() -> list[str]:
    """Each arm of each run: tok/s alone, the ratios beside an idle server and with both busy."""
    body = []
    for run, rs in runs(rows("shared_host")).items():
        for r in rs:
            env = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "-"
            busy = " / ".join(f"{x:.2f}x" for x in r["both_busy_ratio"])
            start = f"{r['start_alone_s']:.0f} / {r['start_beside_idle_s']:.0f}"
            body.append([run, r["arm"], env, f"{r['alone_tok_s']:.1f}", f"{r['beside_idle_ratio']:.2f}x", busy, start])
    head = ["run", "arm", "environment", "alone tok/s", "beside idle", "both busy", "start s (alone / beside idle)"]
    return table(head, body) + [
        "",
        "Ratios over the same arm's alone tok/s. Targets: beside idle >= 0.9x, both busy >= 0.35x.",
        "",
    ]


def profile_table() -> list[str]:
    """Per run: ms a step by batch size and width per arm (best over repeats) and width W over width 1."""
    out = []
    for run, rs in runs(rows("profile_table")).items():
        arms = list(dict.fromkeys(r["arm"] for r in rs))
        best: dict[tuple, float] = {}
        for r in rs:
            key = (r["arm"], r["bs"], r["width"])
            best[key] = min(r["ms"], best.get(key, r["ms"]))
        widths = sorted({w for _, _, w in best})
        body = []
        for bs in sorted({b for _, b, _ in best}):
            for arm in arms:
                cells = [f"{best[(arm, bs, w)]:.1f} ({best[(arm, bs, w)] / best[(arm, bs, 1)]:.2f})" for w in widths]
                body.append([bs, arm, *cells])
        out += [f"Run `{run}`: {rs[0].get('label') or ''}", ""]
        out += table(["bs", "arm", *[f"W{w} ms (/W1)" for w in widths]], body) + [""]
    return out


def draft_block() -> list[str]:
    """Per run: walk tau by verify width on each held-out set, and the draft ms by batch, per rows drafted."""
    out = []
    for run, rs in runs(rows("draft_block")).items():
        sets = list(rs[0]["tau"])
        widths = sorted({int(w) for r in rs for t in r["tau"].values() for w in t})
        batches = list(rs[0]["draft_ms"])
        body = []
        for r in rs:
            taus = [" / ".join(str(r["tau"][s].get(str(w), "-")) for s in sets) for w in widths]
            body.append([r["block"], *taus, " / ".join(str(r["draft_ms"][b]) for b in batches)])
        head = [
            "rows drafted",
            *[f"tau W{w} ({' / '.join(sets)})" for w in widths],
            f"draft ms (bs {' / '.join(batches)})",
        ]
        out += [f"Run `{run}`, {rs[0]['trained_block']}-row drafter:", ""] + table(head, body) + [""]
    return out


def soak_day() -> list[str]:
    """Each day-of-traffic run: what every request ended as, errors at the kill and elsewhere, the
    greedy check against plain, KV after flush and draft failures."""
    body = []
    for r in rows("soak"):
        if r.get("mix") != "day":
            continue
        ends = f"{r['completed']} / {r['aborted']} / {r['disconnected']} / {r['refused']}"
        greedy = (
            f"{r['greedy_checked']} / {r['greedy_identical']} / {r['greedy_near_ties']} / {r['greedy_wrong_count']}"
        )
        kv = " / ".join(str(v["kv_used_after_flush"]) for v in r["after"].values())
        body.append([f"`{r['run']}`", r["requests"], r["concurrency"], f"{r['wall_s']:.0f}", ends])
        body[-1] += [f"{r['errors_at_kill']} / {r['errors_other']}", r["lost"], greedy, kv, r["draft_failures"]]
    head = ["run", "requests", "concurrency", "wall s", "completed / aborted / disconnected / refused (4xx)"]
    head += ["errors at the kill / other", "unanswered", "greedy checked / identical / near-ties / wrong"]
    head += ["KV after flush (each worker)", "draft failures"]
    if not body:
        return []
    return table(head, body) + ["", "Two workers behind SMG, one SIGKILLed and restarted (`bench/soak_day.py`).", ""]


def bf16_match() -> list[str]:
    """Each arm of each run: prompts identical to plain, and at the first divergences plain's top-2 gap
    and how far below plain's best the arm's token was."""
    body = []
    for run, rs in runs(rows("bf16_match")).items():
        for r in rs:
            gaps = f"{r['first_gap_max']:.3f}" if r["first_gap_max"] is not None else "-"
            tie = f"{r['within_tie']} / {r['prompts'] - r['identical']}" if "within_tie" in r else "-"
            w1 = r.get("identical_to_w1", "-")
            body.append([run, r["config"], f"{r['identical']} / {r['prompts']}", w1, gaps, tie])
    head = ["run", "arm", "identical to plain", "identical to w1", "largest first-divergence gap"]
    head += ["token within two ulps of plain's best / divergences"]
    return table(head, body) + ["", "Greedy, bf16, one request at a time, 128 tokens each (`bench/bf16_match.py`).", ""]
