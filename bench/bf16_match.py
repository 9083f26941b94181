"""How often bf16 greedy output equals plain SGLang's on the embedded model, and why it differs.

float32 greedy output is token-identical to plain decoding (python_tests/test_lossless.py). In bf16 two
paths that round differently (our CPU GEMMs against torch's, a W-row verify forward against a one-row
decode step) can pick different tokens where the target's top two logits sit within a few bf16 ulps.
This bench serves the same greedy requests (one at a time, every request --max-new-tokens tokens) to
plain SGLang and to each arm, and per arm reports the fraction of prompts whose output is identical,
and at each prompt's first divergence plain's top-2 logprob gap there, whether the arm emitted plain's
runner-up, and how far below plain's best the arm's token was (within TIE: a near-tie taken the other
way, not a wrong token). `w1` (our worker at width 1:
our CPU forward, no speculation) against `adaptive` separates our kernels' rounding from the verify
forward's; an arm after `w1` also counts its outputs identical to w1's. Appends to bench/results/bf16_match.jsonl.

python bench/bf16_match.py [--requests 32] [--max-new-tokens 128] [--arms w1 adaptive] [--prompts unseen]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import provenance  # noqa: E402
from sglang_dflash.testing.servers import launch  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "bf16_match.jsonl")
TOP = 5  # plain's top logprobs kept per position
TIE = 0.25  # two bf16 ulps of a logit between 16 and 32 (python_tests/test_lossless.py's BF16_TIE)


def below_best(top: list) -> list[dict]:
    """SGLang's output_top_logprobs (per position [(logprob, id, text), ...], best first) -> per
    position {id: logprob below the best}."""
    return [{int(x[1]): t[0][0] - x[0] for x in t} for t in top]


def near_tie(below) -> bool:
    """A token this far below the best (None: outside the top kept) is a bf16 near-tie; logprobs
    come back in float32, so two ulps read 0.25000006."""
    return below is not None and below <= TIE + 1e-6


def greedy(url: str, ids: list[int], max_new: int, top2: bool) -> dict:
    sp = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    body = {"input_ids": ids, "sampling_params": sp}
    if top2:
        body |= {"return_logprob": True, "top_logprobs_num": TOP}
    r = requests.post(url + "/generate", json=body, timeout=1800)
    r.raise_for_status()
    out = r.json()
    got = {"ids": out["output_ids"]}
    if top2:  # per position [(logprob, id, text), ...] best first
        top = out["meta_info"]["output_top_logprobs"]
        got["gap"] = [t[0][0] - t[1][0] for t in top]
        got["runner_up"] = [t[1][1] for t in top]
        got["top"] = below_best(top)
    return got


def compare(plain: list[dict], arm: list[list[int]]) -> dict:
    """The arm's outputs against plain's: identical fraction, and per first divergence plain's gap and
    whether the arm took plain's runner-up there."""
    firsts = []
    for p, ids in zip(plain, arm):
        j = next((k for k, (a, b) in enumerate(zip(p["ids"], ids)) if a != b), None)
        if j is not None:
            below = p["top"][j].get(ids[j]) if "top" in p else None  # None: outside plain's top TOP
            firsts.append({"at": j, "gap": p["gap"][j], "runner_up": ids[j] == p["runner_up"][j], "below": below})
    gaps = [f["gap"] for f in firsts]
    return {
        "prompts": len(arm),
        "identical": len(arm) - len(firsts),
        "identical_frac": (len(arm) - len(firsts)) / len(arm),
        "diverged_at": [f["at"] for f in firsts],
        "first_gap": gaps,
        "first_gap_max": max(gaps, default=None),
        "first_gap_median": statistics.median(gaps) if gaps else None,
        "runner_up_taken": sum(f["runner_up"] for f in firsts),
        # the arm's token at the first divergence: how far below plain's best (None: outside its top TOP)
        "first_token_below_best": [f["below"] for f in firsts],
        "within_tie": sum(near_tie(f["below"]) for f in firsts),
        "tie": TIE,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--arms", nargs="+", default=["w1", "adaptive"])
    ap.add_argument("--prompts", choices=("heldout", "unseen"), default="unseen")
    a = ap.parse_args()
    prov = provenance.stamp()

    from transformers import AutoTokenizer

    from real_bench import heldout_prompts
    from sglang_dflash.drafters import shipped_drafter
    from sglang_dflash.embedded import derive
    from unseen_set import interleaved_prompts

    model, draft = derive(), shipped_drafter()
    if a.prompts == "unseen":
        batch = interleaved_prompts(model, a.requests)
    else:
        batch = heldout_prompts(AutoTokenizer.from_pretrained(model), a.requests)
    plain_argv = provenance.server_argv(model, None, "bfloat16", [])
    with launch(model, None, "bfloat16", name="bf16-match-plain") as srv:
        plain = [greedy(srv.url, ids, a.max_new_tokens, top2=True) for ids in batch]
    rows, outs = [], {}
    for name in a.arms:
        d, extra, environ = provenance.arm(name, draft, [], False)
        with launch(model, d, "bfloat16", extra=extra, env=environ, name=f"bf16-match-{name}") as srv:
            got = [greedy(srv.url, ids, a.max_new_tokens, top2=False)["ids"] for ids in batch]
        row = {"config": name, "baseline": "plain", "prompts_set": a.prompts, "max_new_tokens": a.max_new_tokens}
        row |= compare(plain, got) | {"env": environ, "argv": provenance.server_argv(model, d, "bfloat16", extra)}
        outs[name] = got
        if name != "w1" and "w1" in outs:  # speculation's own share of the differences: against our width 1
            row["identical_to_w1"] = sum(x == y for x, y in zip(got, outs["w1"]))
        row["plain_argv"] = plain_argv
        rows.append(row | provenance.base_fields(prov))
        print(
            f"{name}: {row['identical']}/{row['prompts']} identical to plain; first-divergence gaps "
            f"{[round(g, 3) for g in row['first_gap']]}; plain's runner-up taken {row['runner_up_taken']}; "
            f"within {TIE} of plain's best {row['within_tie']}",
            flush=True,
        )
    print(f"run {provenance.append_rows(RESULTS, rows, prov)}")


if __name__ == "__main__":
    main()
