"""Unseeded sampled requests through real servers: every DFlash 1 proposal rule draws what plain
decoding draws, at the positions accepted drafts decide.

N unseeded requests per setting (top-k at T=1, min-p at T=0.5), 8 new tokens each, to a plain server and to DFLASH
servers under each proposal rule (`qall` with a reduced draft vocabulary (d2t), `q1`, `argmax`) with
the width pinned to the block, and with the width pinned to 1. The `flat` drafter
(testing/broken_drafter.flat_drafter) spreads q out (its final norm scaled, testing/broken_drafter.py), so every broken rule
changes what is drawn. Output positions 1..4 (after the
prefill's token: verify-step draws, many of them accepted drafts) are compared with the plain
server's own draws by a chi-square test of homogeneity (chi2.py); every DFLASH token the plain
server never drew at that position (the tokens a pooled sparse cell could hide) is checked against
the plain server's own support at its prefix (its logprobs over the whole vocabulary). The slow tier
(`make test-slow`) runs the same test against servers with each deliberately broken rule
(testing/broken_rules.py) and requires that each fails it.
"""

import concurrent.futures as cf

import pytest
import chi2
from chi2 import homogeneity_p

from sglang_dflash.testing.broken_rules import RULES
from sglang_dflash.testing.servers import launch, prompts

PROMPT = prompts(6, seed=3, max_len=40)[2]
VOCAB = 384  # the tiny target's vocabulary
N, NEW, POSITIONS = 900, 8, (1, 2, 3, 4)
SETTINGS = {"t1-topk": {"temperature": 1.0, "top_k": 24}, "t05-minp": {"temperature": 0.5, "min_p": 0.02}}
SERVERS = {  # name -> (proposal rule, drafter, pinned width)
    "qall-d2t-w16": ("qall", "d2t", 16),  # steered, reduced draft vocabulary
    "qall-flat-w16": ("qall", "flat", 16),  # a spread-out q: truncation and temperature matter
    "q1-flat-w16": ("q1", "flat", 16),
    "argmax-w16": ("argmax", "steered", 16),
    "w1": ("qall", "steered", 1),
}
# 40 comparisons against one shared plain sample, each a chi-square approximation: at N 600 and 1e-4
# a correct sampler failed once in CI (p 1.1e-5; 2,000 draws of the same setting: p 0.54). The broken
# rules measured 2.9e-8 to 3e-78 at N 600 and 4.4e-10 to 2e-109 at N 900 (correct servers: min 0.012).
MIN_P = 1e-6


def draws(srv, params):
    """[N] outputs of NEW tokens each, unseeded, sent 32 at a time."""
    body = {"ignore_eos": True, **params}
    with cf.ThreadPoolExecutor(32) as ex:
        outs = list(ex.map(lambda _: srv.generate(PROMPT, NEW, **body), range(N)))
    return outs


def run(srv):
    got = {}
    for name, sp in SETTINGS.items():
        outs = draws(srv, sp)
        got[name] = {pos: [o["output_ids"][pos] for o in outs] for pos in POSITIONS}
        got[name]["outs"] = [o["output_ids"] for o in outs]
        verify = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs)  # 0 on the plain server
        got[name]["tau"] = sum(o["meta_info"]["completion_tokens"] for o in outs) / max(1, verify)
    return got


def outside_support(plain, ref, got):
    """(setting, position, token) of every DFLASH token that the plain server never drew there and
    that its sampler cannot draw at that prefix."""
    return [
        (name, pos, tok)
        for name, sp in SETTINGS.items()
        for pos in POSITIONS
        for _, tok in chi2.outside_support(plain, PROMPT, VOCAB, ref[name]["outs"], got[name]["outs"], pos, sp)
    ]


def seed(name: str) -> list[str]:
    """Each server its own --random-seed: two servers seeded alike draw unseeded requests from one
    torch stream, and the chi-square test assumes the two samples independent."""
    return ["--random-seed", str(1 + sorted([*SERVERS, "plain", *RULES]).index(name))]


def launch_rule(target, drafter, rule, width, broken=None, name=""):
    env = {"SGLANG_DFLASH_PROPOSAL": rule, "SGLANG_DFLASH_WIDTH": str(width)}
    if broken:
        env["SGLANG_DFLASH_DEBUG_BROKEN_RULE"] = broken
    return launch(target, drafter, "float32", extra=seed(broken or name), env=env, name=f"dflash-{broken or name}")


@pytest.fixture(scope="module")
def served(pair):
    """Every DFLASH server's draws, then the plain server's draws and its support checks."""
    from sglang_dflash.testing.pairs import MIXED, ROOT

    from sglang_dflash.testing.broken_drafter import flat_drafter

    target, reduced = pair("llama", "float32", MIXED["llama"], draft_vocab=96)
    _, steered = pair("llama", "float32", MIXED["llama"])
    drafters = {"d2t": reduced, "steered": steered, "flat": flat_drafter(steered, ROOT)}
    got = {}
    for name, (rule, drafter, width) in SERVERS.items():
        with launch_rule(target, drafters[drafter], rule, width, name=name) as srv:
            got[name] = run(srv)
    with launch(target, None, "float32", extra=seed("plain"), name="plain-sampled-rules") as plain:
        ref = run(plain)
        outside = {name: outside_support(plain, ref, g) for name, g in got.items()}
    return target, drafters["flat"], ref, got, outside


@pytest.mark.server
@pytest.mark.parametrize("name", list(SERVERS))
def test_sampled_tokens_match_plain_server_draws(served, name):
    _, _, ref, all_got, outside = served
    got = all_got[name]
    assert not outside[name], f"{name}: tokens outside the target's support (setting, position, token)"
    bad = []
    for setting in SETTINGS:
        for pos in POSITIONS:
            p = homogeneity_p(ref[setting][pos], got[setting][pos])
            print(f"{name} {setting} position {pos}: p={p:.3g} (tau {got[setting]['tau']:.2f})")
            if p <= MIN_P:
                bad.append((setting, pos, p))
        if SERVERS[name][2] > 1:
            assert got[setting]["tau"] > 1.1, (name, setting, got[setting]["tau"])  # drafts decide tokens
    assert not bad, f"{name}: DFLASH draws differ from plain decoding's at {bad}"


@pytest.fixture(scope="module")
def broken_rows():
    """The broken-rule tier's p-values, appended to bench/results/broken_rules.jsonl as one run (the
    numbers the MIN_P comment and docs/testing.md quote come from these rows)."""
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "bench"))
    from provenance import append_rows, base_fields, stamp

    prov, rows = stamp(), []
    yield rows
    if rows:
        path = os.path.join(root, "bench", "results", "broken_rules.jsonl")
        print(f"{path}: run {append_rows(path, [{**r, **base_fields(prov)} for r in rows], prov)}")


@pytest.fixture(scope="module")
def plain_draws(pair):
    """The broken tier's own plain sample (the slow tier runs without `served`'s five servers)."""
    from sglang_dflash.testing.pairs import MIXED, ROOT

    from sglang_dflash.testing.broken_drafter import flat_drafter

    target, steered = pair("llama", "float32", MIXED["llama"])
    with launch(target, None, "float32", extra=seed("plain"), name="plain-broken-rules") as plain:
        ref = run(plain)
    return target, flat_drafter(steered, ROOT), ref


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("broken", RULES)
def test_each_broken_rule_fails_the_served_test(plain_draws, broken_rows, broken):
    target, flat, ref = plain_draws
    with launch_rule(target, flat, "qall", 16, broken) as srv:
        got = run(srv)
    ps = {f"{s}@{pos}": float(homogeneity_p(ref[s][pos], got[s][pos])) for s in SETTINGS for pos in POSITIONS}
    print(f"{broken}: min p={min(ps.values()):.3g}")
    tau = {s: round(got[s]["tau"], 3) for s in SETTINGS}
    broken_rows.append(
        {"rule": broken, "server": "qall-flat-w16", "n": N, "min_p": min(ps.values()), "threshold": MIN_P, "p": ps}
        | {"tau": tau, "caught": bool(min(ps.values()) <= MIN_P)}
    )
    assert min(ps.values()) <= MIN_P, f"{broken} passes the served test: it cannot tell this broken rule"
