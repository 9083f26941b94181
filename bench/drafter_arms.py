"""Drafter training arms compared (issue 14): data sources and sizing by tau per second of step.

For each candidate drafter (a training checkpoint `WORKDIR/ckpt/best.pt` or an exported folder):
- its training (checkpoints: WORKDIR/train_summary.json): steps, seconds, labelled tokens,
  block tokens/s, answers only or not, and the learning curve (held-out walk tau vs tokens);
- tau_W: the held-out walk (blocks.walk_counts: the serving-equivalent greedy walk, each step
  drafting and verifying its first W rows) over the first 128 tokens of every held-out answer;
- sampled_walk: the walk (each block drafted whole, its first W rows verified) at each --temperatures T
  under the argmax / q1 / qall proposal rules (DFlash 2: argmax, the greedy path, and path, the sampled one)
  (train/sampled_walk.py: expected tokens per verify step from the target's p and the drafter's q
  per slot, p teacher-forced), {"T0.7": {rule: {W: tau}}}; T0 is the greedy walk again (a check);
- draft_ms_W: the draft stage (pipeline/draft.propose, the drafter's shape and draft vocabulary;
  random weights, timing does not depend on them) at batch 1, one thread, bf16;
- verify_ms_W and other_ms_W (sample + KV write) per step, and plain decoding's ITL, measured by the
  server in one `real_bench.py` run at concurrency 1 (its fixed-width rows; --costs).
predicted speedup_W = tau_W * plain ITL / (verify_ms_W + draft_ms_W + other_ms_W), best over W.
The served speedup also pays prefill and scheduling (about 3% at concurrency 1): rank by this,
confirm the chosen drafter with real_bench.py.

    OMP_NUM_THREADS=1 python bench/drafter_arms.py --workdir WORKDIR UNSEEN_DIR -- NAME=PATH [NAME=PATH ...]

Appends one run to bench/results/drafter_arms.jsonl and draws drafter_arms.png (the learning curves
of the newest row per name).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import provenance  # noqa: E402
from draft_head_bench import draft_call  # noqa: E402

from sglang_dflash.embedded import derive  # noqa: E402
from sglang_dflash.model.config import parse_drafter_config  # noqa: E402
from sglang_dflash.model.draft_vocab import d2t_from_ids, ids_from_d2t  # noqa: E402
from sglang_dflash.model.drafter import DFlashDrafter  # noqa: E402
from sglang_dflash.train.blocks import walk_counts  # noqa: E402
from sglang_dflash.model.checkpoint import load_exported  # noqa: E402
from sglang_dflash.train.features import load_seqs, load_target  # noqa: E402
from sglang_dflash.train.sampled_walk import sampled_walk_counts, taus  # noqa: E402
from sglang_dflash.train.target_files import load_embedding  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def load(path: str, model: str):
    """-> (drafter, cfg, mask token id, draft vocab ids or None) from a checkpoint or exported folder."""
    if os.path.isdir(path):
        d, cfg, mask = load_exported(path, model)
        return d, cfg, mask, ids_from_d2t(d.d2t) if cfg.draft_vocab_size else None
    ck = torch.load(path, weights_only=False)
    with open(os.path.join(model, "config.json")) as f:
        cfg = parse_drafter_config(ck["config"], json.load(f)["num_hidden_layers"])
    d = DFlashDrafter(cfg)
    d.load_state_dict(ck["model"])
    return d.eval(), cfg, cfg.mask_token_id, ids_from_d2t(d.d2t) if cfg.draft_vocab_size else None


def training(path: str) -> dict:
    """A checkpoint's run (WORKDIR/train_summary.json), {} for an exported folder."""
    summary = os.path.join(os.path.dirname(os.path.dirname(path)), "train_summary.json")
    if os.path.isdir(path) or not os.path.exists(summary):
        return {}
    with open(summary) as f:
        s = json.load(f)
    keep = ("steps", "train_s", "tok_s", "no_text", "train_seqs", "best_tau")
    curve = [{k: h[k] for k in ("tokens", "train_s", "tau")} for h in s["history"]]
    return {**{k: s.get(k) for k in keep}, "tokens": curve[-1]["tokens"] if curve else 0, "curve": curve}


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for r in rows:
        if r["training"].get("curve"):
            c = r["training"]["curve"]
            ax.plot([h["train_s"] / 60 for h in c], [h["tau"] for h in c], marker="o", label=r["name"])
    ax.set_xlabel("training minutes (two threads)")
    ax.set_ylabel("held-out walk tau (first 128 tokens)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_sampled(rows: list[dict], path: str) -> None:
    """Walk tau at the whole block per set: greedy, then each temperature's proposal rules."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys((t, rule) for r in rows for t in r["sampled_walk"] for rule in r["sampled_walk"][t]))
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    width = 0.8 / len(keys)
    for i, (t, rule) in enumerate(keys):
        ys = [
            r["sampled_walk"].get(t, {}).get(rule, {}).get(str(r["block"]), 0.0) for r in rows
        ]  # DFlash 1 / 2 rules differ
        label = "greedy" if t == "T0" else f"{t} {rule}"
        ax.bar([j + i * width for j in range(len(rows))], ys, width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels([f"{r['name']}\n{r['heldout_set']} ({r['heldout']})" for r in rows], fontsize=8)
    ax.set_ylabel(f"expected tokens per verify step (W{rows[0]['block']})")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def costs(path: str) -> dict:
    """Per-step ms at concurrency 1 T0 from the real_bench run with the most fixed-width rows of the
    package's drafter (the newest of those): {"run", "commit", "itl_plain": ms, W: (verify_ms, other_ms)}."""
    with open(path) as f:
        rows = [r for r in map(json.loads, f) if r["concurrency"] == 1 and r["temperature"] == 0]
    fixed = [r["run"] for r in rows if r["config"][5:].isdigit() and r["config"].startswith("fixed")]
    run = max(reversed(fixed), key=fixed.count)
    rows = [r for r in rows if r["run"] == run]
    plain = next(r["itl_p50"] for r in rows if r["config"] == "plain")
    out = {"run": run, "commit": rows[0]["commit"], "itl_plain": 1e3 * plain}
    for r in rows:
        if r["config"][5:].isdigit() and r["config"].startswith("fixed"):
            w = int(r["config"][5:])
            steps, st = r["width_steps"][str(w)], r["stage_s"]
            out[w] = (1e3 * st["verify"] / steps, 1e3 * (st["sample"] + st["kv_write"]) / steps)
    return out


@torch.inference_mode()
def draft_ms(cfg, embed: torch.Tensor, width: int, ctx: int = 256, repeats: int = 15) -> float:
    d = DFlashDrafter(cfg).to(torch.bfloat16).eval()
    n = cfg.draft_vocab_size or embed.shape[0]  # the candidate's own head size
    d.register_buffer("d2t", d2t_from_ids(torch.arange(n)))
    head = embed[:n].contiguous()
    run = draft_call(d, cfg, embed, head, 1, ctx, width)
    times, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # as the c=1 costs were measured (one server thread)
    for i in range(repeats + 3):
        t0 = time.perf_counter()
        run()
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    torch.set_num_threads(threads)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("candidates", nargs="+", help="NAME=PATH (ckpt .pt or exported folder)")
    ap.add_argument("--workdir", nargs="+", required=True, help="held-out sets: workdirs whose features hold them")
    ap.add_argument("--costs", default=os.path.join(RESULTS, "real_bench.jsonl"))
    ap.add_argument("--max-answer", type=int, default=128)
    ap.add_argument("--set-names", nargs="*", default=[], help="names of the --workdir sets (default: folder names)")
    ap.add_argument("--label", default="", help="what the run compares (the results page's heading)")
    ap.add_argument("--temperatures", nargs="*", type=float, default=[0.7, 1.0], help="sampled walks (none: off)")
    ap.add_argument("--max-seqs", type=int, default=0, help="walk the first N of each set (0: all; row: heldout)")
    a = ap.parse_args()
    torch.set_num_threads(2)  # the walks; draft_ms times on one
    model, prov, cost = derive(), provenance.stamp(), costs(a.costs)
    sets = {w: load_seqs(w)[1][: a.max_seqs or None] for w in a.workdir}
    names = a.set_names or [os.path.basename(os.path.normpath(w)) for w in a.workdir]
    set_names = dict(zip(a.workdir, names))  # never a machine's absolute path in the results
    embed = load_embedding(model)
    target = load_target(model) if a.temperatures else None  # the sampled walks' p
    rows = []
    for cand in a.candidates:
        name, path = cand.split("=", 1)
        d, cfg, mask, dv = load(path, model)
        dms = {w: draft_ms(cfg, embed, w) for w in cost if isinstance(w, int) and w <= cfg.block_size}
        for wd, held in sets.items():
            inside = not os.path.relpath(path).startswith("..")  # a repository path; else the arm's name
            row = {"name": name, "path": os.path.relpath(path) if inside else name, "layers": cfg.num_layers}
            row.update(block=cfg.block_size, heldout_set=set_names[wd], heldout=len(held), label=a.label)
            row.update(max_answer=a.max_answer, costs_commit=cost["commit"])
            row.update(training=training(path), widths={})
            for w, dm in dms.items():
                counts = walk_counts(d, embed, mask, cfg.block_size, held, a.max_answer, vocab=dv, widths=[w])
                tau = sum(t for t, _ in counts) / max(sum(b for _, b in counts), 1)
                verify, other = cost[w]
                speed = tau * cost["itl_plain"] / (verify + dm + other)
                row["widths"][w] = {"tau": round(tau, 3), "draft_ms": round(dm, 2), "verify_ms": round(verify, 1)}
                row["widths"][w].update(other_ms=round(other, 1), predicted_speedup=round(speed, 3))
            if target is not None:
                temps = (0.0, *a.temperatures)
                kw = dict(widths=tuple(dms), max_answer=a.max_answer, vocab=dv)
                counts = sampled_walk_counts(d, embed, mask, cfg.block_size, held, target, temps, **kw)
                row["sampled_walk"] = taus(counts)
            best = max(row["widths"].items(), key=lambda kv: kv[1]["predicted_speedup"])
            row.update(best_width=best[0], predicted_speedup=best[1]["predicted_speedup"], **prov)
            rows.append(row)
            keys = ("name", "heldout_set", "layers", "block", "best_width", "predicted_speedup", "widths")
            print(json.dumps({k: row.get(k) for k in keys + ("sampled_walk",)}), flush=True)
        brief = {k: v for k, v in rows[-1]["training"].items() if k != "curve"}
        print("  training:", json.dumps(brief), flush=True)
    out = os.path.join(RESULTS, "drafter_arms.jsonl")
    provenance.append_rows(out, rows, prov)
    with open(out) as f:  # every arm measured so far on the first set (the newest row per name)
        latest = {r["name"]: r for r in map(json.loads, f) if r["heldout_set"] == names[0]}
    plot(list(latest.values()), os.path.join(RESULTS, "drafter_arms.png"))
    if any("sampled_walk" in r for r in rows):
        plot_sampled([r for r in rows if "sampled_walk" in r], os.path.join(RESULTS, "sampled_walk.png"))


if __name__ == "__main__":
    main()
