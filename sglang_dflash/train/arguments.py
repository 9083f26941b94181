"""The command line of `python -m sglang_dflash.train`: every stage's flags, and the deadline's parse."""

from __future__ import annotations

import argparse
import datetime as dt
import os

DRAFTER_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "drafters", "smollm2-135m-instruct-dflash"
)
PIPELINE = ("corpus", "datagen", "features", "train", "export")  # `all` runs them in this order
TOOLS = ("cut", "mix", "grow", "dflash2")  # one-shot transforms of an exported drafter


def parse_deadline(s: str | None, now: dt.datetime | None = None) -> float | None:
    """HH:MM UTC -> the next such time (a run started at 23:50 with --deadline 01:15 ends tomorrow)."""
    if not s:
        return None
    now = now or dt.datetime.now(dt.timezone.utc)
    h, m = map(int, s.split(":"))
    t = now.replace(hour=h, minute=m, second=0, microsecond=0)
    if t <= now:
        t += dt.timedelta(days=1)
    return t.timestamp()


def parse_args(argv=None, description: str = "Train a DFlash drafter, each stage resumable.") -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("stage", choices=["all", *PIPELINE, *TOOLS])
    ap.add_argument("--workdir", default="train_run")
    ap.add_argument("--model", default=None, help="target HF folder (default: the embedded SmolLM2)")
    ap.add_argument("--deadline", default=None, help="HH:MM UTC (the next one to come); every stage respects it")
    ap.add_argument("--train-minutes", type=float, help="train: stop after this many minutes (an arm's budget)")
    ap.add_argument("--n", type=int, default=3000, help="prompts to generate answers for")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--datagen-minutes", type=float, default=25.0, help="datagen stops after this")
    ap.add_argument("--max-new-tokens", type=int, default=224)
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument(
        "--datagen-procs",
        type=int,
        default=1,
        help="all: 1 = datagen beside the features; N = N processes, then features",
    )
    ap.add_argument("--datagen-draft", help="datagen through DFLASH with this drafter (same chains, faster)")
    ap.add_argument("--shard", type=int, default=0, help="datagen: this process's shard of --shards")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--num-layers", type=int, default=2)
    ap.add_argument("--num-context-layers", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup-steps", type=int, default=60, help="linear lr warm-up steps")
    ap.add_argument("--anchors", type=int, default=8, help="anchors per training sequence")
    ap.add_argument("--seqs", type=int, default=16, help="sequences per training step")
    ap.add_argument("--negatives", type=int, default=8192, help="sampled out-of-answer-vocab negatives per step")
    ap.add_argument("--distil", type=float, default=0.0, help="weight of the target's top-k distribution (0: off)")
    ap.add_argument("--distil-temperature", type=float, default=1.0, help="--distil at this T (tempered_distil.py)")
    ap.add_argument("--gamma", type=float, default=4.0, help="loss weight of block position k: exp(-(k-1)/gamma)")
    ap.add_argument("--ckpt-minutes", type=float, default=3.0)
    ap.add_argument("--features-minutes", type=float, default=30.0, help="features stop after this")
    ap.add_argument("--min-train-minutes", type=float, default=60.0, help="datagen/features leave this")
    ap.add_argument("--text-answer-tokens", type=int, default=320, help="corpus documents' assistant cut")
    ap.add_argument(
        "--exclude-docs", help="held-out rows (bench/unseen_set.py's data.jsonl) whose source documents stay out"
    )
    ap.add_argument(
        "--prompts",
        choices=["templates", "corpus", "long", "followup"],
        default="templates",
        help="datagen's prompts: prompts.py's templates, the corpus documents' user turns, long "
        "prompts (a whole installed file or document, then a question: long_prompts.py), or a second "
        "turn after an earlier datagen's answers (--followup-of, followup_prompts.py)",
    )
    ap.add_argument("--followup-of", help="--prompts followup: the earlier datagen workdir (its --seed too)")
    ap.add_argument("--no-text", action="store_true", help="answers only (no corpus, no documents)")
    ap.add_argument("--draft-vocab", type=int, default=0, help="train over a reduced draft vocabulary (0: full)")
    ap.add_argument("--keep-draft-vocab", action="store_true", help="train over --init-from's draft vocabulary")
    ap.add_argument("--export-vocab", type=int, default=-1, help="export cut: -1 measured choice, 0 full, N")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for features and training")
    ap.add_argument("--export-margin-minutes", type=float, default=4.0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--init-from", help="an exported drafter to continue training from (train/warm_start.py)")
    ap.add_argument(
        "--extra-features", nargs="*", default=[], help="earlier runs' workdirs: their train split is trained on too"
    )
    ap.add_argument("--mix-weight", type=float, default=0.7, help="mix: the child's (--init-from) share")
    ap.add_argument(
        "--grow-init", default="copy", help="grow: new layers from the parent's last (copy) or the target's"
    )
    ap.add_argument("--selector-rank", type=int, default=32, help="dflash2: the selector's codebook rank")
    ap.add_argument("--selector-top-k", type=int, default=8, help="dflash2: candidates per block position")
    ap.add_argument("--out", default=DRAFTER_DIR, help="export folder")
    ap.add_argument("--drafter", default=DRAFTER_DIR, help="cut: the exported drafter to give a reduced vocabulary")
    return ap.parse_args(argv)
