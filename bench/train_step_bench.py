"""CPU timing of one drafter training step (trainer.py's step) by LM-head loss, side by side.

Arms, alternated within every repeat (drift hits all alike):
- unfused_full: the loss before head_loss.py: bf16 logits over the label vocabulary + sampled
  negatives, their fp32 copy, F.cross_entropy (reduction none), weighted mean;
- fused_full: head_loss.head_cross_entropy over the same rows;
- fused_<N>: head_cross_entropy over a reduced draft vocabulary of N rows (--draft-vocab N), no
  negatives.
The step is the trainer's: 16 sequences x 8 anchors (blocks of 16) through blocks.block_hidden under
bf16 autocast, the loss, backward, clip, AdamW; the shipped drafter's shape, random features and
weights (timing does not depend on them). Reports seconds per stage (forward, loss, backward,
optimizer; medians over repeats) and labelled block tokens/s.

    python bench/train_step_bench.py [--head 26258] [--vocab 16384] [--repeats 5] [--threads 2]

Appends one run to bench/results/train_step.jsonl and draws train_step.png from its rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import provenance  # noqa: E402

from sglang_dflash.model.config import parse_drafter_config  # noqa: E402
from sglang_dflash.model.drafter import DFlashDrafter  # noqa: E402
from sglang_dflash.train.__main__ import DRAFTER_DIR  # noqa: E402
from sglang_dflash.train.blocks import Seq, block_hidden, sample_anchors  # noqa: E402
from sglang_dflash.train.head_loss import head_cross_entropy  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def unfused(hidden, head, tgt, w):
    """The trainer's loss before head_loss.py (kept here as the baseline arm)."""
    logits = (hidden.to(torch.bfloat16) @ head.t()).float()
    ce = F.cross_entropy(logits, tgt, reduction="none")
    m = w * (tgt >= 0)
    return (ce * m).sum() / m.sum()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head", type=int, default=26258, help="full arm's rows (label vocab + negatives)")
    ap.add_argument("--vocab", type=int, default=16384, help="reduced draft vocabulary arm")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per arm and repeat")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    prov = provenance.stamp()
    torch.set_num_threads(a.threads)
    with open(os.path.join(DRAFTER_DIR, "config.json")) as f:
        cdict = json.load(f)
    cdict.pop("draft_vocab_size", None)
    cfg = parse_drafter_config(cdict, 30)
    g = torch.Generator().manual_seed(0)
    H = cfg.hidden_size
    seqs = [Seq(f"s{i}", torch.randint(0, 49152, (350,), generator=g), torch.randn(350, 3 * H).bfloat16(), 100) for i in range(16)]  # fmt: skip
    embed = (torch.randn(49152, H, generator=g) * 0.05).bfloat16()
    weights = torch.exp(-torch.arange(cfg.block_size - 1, dtype=torch.float32) / 4.0)
    arms = {"unfused_full": (unfused, a.head), "fused_full": (head_cross_entropy, a.head)}
    arms[f"fused_{a.vocab}"] = (head_cross_entropy, a.vocab)
    drafter = DFlashDrafter(cfg).train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-5)

    def step(loss_fn, rows):
        t = [time.perf_counter()]
        batch = sample_anchors(seqs, 128, cfg.block_size, g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden, tgt = block_hidden(drafter, embed, cfg.mask_token_id, cfg.block_size, batch)
        t.append(time.perf_counter())
        tgt = torch.where(tgt >= 0, tgt % rows, tgt)
        n, k, h = hidden.shape
        loss = loss_fn(hidden.reshape(n * k, h), embed[:rows], tgt.flatten(), weights.expand(n, k).flatten())
        t.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        t.append(time.perf_counter())
        return [b - x for x, b in zip(t, t[1:])], int((tgt >= 0).sum())

    for fn, rows in arms.values():  # warm-up
        step(fn, rows)
    times = {name: [] for name in arms}
    for rep in range(a.repeats):
        for name in list(arms) if rep % 2 == 0 else list(arms)[::-1]:
            for _ in range(a.steps):
                times[name].append(step(*arms[name]))
    rows_out = []
    for name, runs in times.items():
        stages = [statistics.median(r[0][i] for r in runs) for i in range(4)]
        tok = statistics.median(r[1] / sum(r[0]) for r in runs)
        row = {"arm": name, "head_rows": arms[name][1], "threads": a.threads, "steps": len(runs)}
        row |= dict(zip(("forward_s", "loss_s", "backward_s", "optimizer_s"), map(lambda x: round(x, 4), stages)))
        row |= {"step_s": round(sum(stages), 4), "block_tok_s": round(tok, 1), **prov}
        rows_out.append(row)
        print(json.dumps({k: row[k] for k in ("arm", "step_s", "forward_s", "loss_s", "backward_s", "block_tok_s")}))
    provenance.append_rows(os.path.join(RESULTS, "train_step.jsonl"), rows_out, prov)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    bottom = [0.0] * len(rows_out)
    for stage in ("forward_s", "loss_s", "backward_s", "optimizer_s"):
        vals = [r[stage] for r in rows_out]
        ax.bar([r["arm"] for r in rows_out], vals, bottom=bottom, label=stage[:-2])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("seconds per step (median)")
    ax.set_title(f"drafter training step, {a.threads} threads, 128 anchors x 16")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "train_step.png"), dpi=110)


if __name__ == "__main__":
    main()
