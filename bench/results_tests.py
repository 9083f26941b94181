"""Tables of the evidence that the tests can fail: mutation runs (bench/mutations.py) and the served
broken-rule tier (python_tests/test_sampled_rules.py in `make test-slow`)."""

from __future__ import annotations

from results_tables import rows, runs, table


def mutations() -> list[str]:
    """Each mutation's newest run: how many tests of its selection failed."""
    newest: dict[str, dict] = {}
    for run_rows in reversed(list(runs(rows("mutations")).values())):  # oldest run first: newer ones win
        for r in run_rows:
            newest[r["mutation"]] = r
    body = [
        [r["run"], f"`{m}`", r["file"], " ".join(r["selection"]), f"{r['caught']} of {r['tests']}", r["why"]]
        for m, r in newest.items()
    ]
    return table(["run", "mutation", "file", "tests", "failed", "what it breaks"], body) + [""]


def broken_rules() -> list[str]:
    """Each deliberately broken sampling rule's smallest chi-square p-value, newest run first."""
    body = [
        [run, r["rule"], r["server"], r["n"], f"{r['min_p']:.2g}", r["threshold"], "yes" if r["caught"] else "**no**"]
        for run, rs in runs(rows("broken_rules")).items()
        for r in rs
    ]
    return table(["run", "rule", "server", "draws", "min p", "bar", "caught"], body) + [""]
