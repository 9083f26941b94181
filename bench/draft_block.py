"""The drafter's block cut to the verify width: what a narrower block costs and what it keeps.

A width-W step verifies drafts 1..W-1, but the drafter drafts its whole trained block (B rows a
request) in one non-causal forward. Drafting a shorter block [anchor, MASK x (b-1)] (b >= W) costs
b/B of the rows; the drafts at slots 1..W-1 then see fewer mask positions than in training, so
they may be accepted less often. Per block b and width W <= b:
- tau: the greedy walk (train/blocks.walk over accepted_per_anchor at block b, first W rows
  verified) on each held-out set;
- draft_ms: the draft stage (pipeline/draft.propose, the shipped drafter, our bf16 GEMMs, two
  threads) at batch sizes --bs over a 256-token context.

python bench/draft_block.py --workdir SET [SET ...] [--blocks 4 8 16] [--bs 1 4 16]
SET: a folder with held-out features (bench/unseen_set.py --fresh / --templated N --out SET).
Appends one run to bench/results/draft_block.jsonl.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402
from draft_head_bench import draft_call, timed  # noqa: E402
import statistics  # noqa: E402
from drafter_arms import load  # noqa: E402

from sglang_dflash.drafters import shipped_drafter  # noqa: E402
from sglang_dflash.embedded import derive  # noqa: E402
from sglang_dflash.cpu import cpu_linear  # noqa: E402
from sglang_dflash.train.blocks import accepted_per_anchor, walk  # noqa: E402
from sglang_dflash.train.features import load_seqs  # noqa: E402
from sglang_dflash.train.target_files import load_embedding  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "draft_block.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", nargs="+", required=True)
    ap.add_argument("--blocks", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--max-answer", type=int, default=128)
    ap.add_argument("--out", default=RESULTS)
    a = ap.parse_args()
    prov, model = provenance.stamp(), derive()
    torch.set_num_threads(2)
    embed = load_embedding(model)
    d, cfg, mask, vocab = load(shipped_drafter(), model)
    head = embed if vocab is None else embed[vocab].contiguous()
    if not cpu_linear.enable("cpu", torch.bfloat16):
        raise SystemExit(
            "our CPU GEMMs are off here (SGLANG_DFLASH_CPU_OPS linear=, the extension): the timing would be torch's"
        )
    d_bf16 = load(shipped_drafter(), model)[0].to(torch.bfloat16)
    d_bf16.route_matmuls(cpu_linear.linear)
    rows = []
    for b in a.blocks:
        short = dataclasses.replace(cfg, block_size=b)
        row = {**provenance.base_fields(prov), "block": b, "trained_block": cfg.block_size, "tau": {}, "draft_ms": {}}
        for wd in a.workdir:
            runs = accepted_per_anchor(d, embed, mask, b, load_seqs(wd)[1], a.max_answer, vocab=vocab)
            name = os.path.basename(os.path.normpath(wd))
            row["tau"][name] = {}
            for w in (x for x in (2, 4, 8, 16) if x <= b):
                counts = [walk(acc, start, end, [w]) for acc, start, end in runs]
                row["tau"][name][w] = round(sum(t for t, _ in counts) / max(sum(n for _, n in counts), 1), 3)
        with torch.inference_mode():
            for bs in a.bs:
                call = draft_call(d_bf16, short, embed, head, bs, 256, b)
                times = [timed(call) for _ in range(13)][3:]  # three warm-ups
                row["draft_ms"][bs] = round(statistics.median(times), 2)
        print(row["block"], row["tau"], row["draft_ms"], flush=True)
        rows.append(row)
    provenance.append_rows(a.out, rows, prov)


if __name__ == "__main__":
    main()
