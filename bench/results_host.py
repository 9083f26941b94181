"""Tables of how a server shares its host and what a decode step costs by width: two servers side by
side (bench/shared_host.py), the start-up step-cost table per checkout (bench/profile_table.py) and
the drafter's block cut to the verify width (bench/draft_block.py)."""

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
