"""Train our own DFlash drafter for the embedded SmolLM2 target, each stage resumable.

python -m sglang_dflash.train all --workdir /work/train_run --deadline 14:40
python -m sglang_dflash.train {datagen,features,train,export} --workdir W [...]

--deadline HH:MM (UTC, today) bounds the whole run: datagen stops early enough to leave time for
features and training, training stops at the deadline minus the export margin, and the best
checkpoint (by held-out tau) is exported.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import sys
import time

DRAFTER_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "drafters", "smollm2-135m-instruct-dflash"
)


def parse_deadline(s: str | None) -> float | None:
    if not s:
        return None
    now = dt.datetime.now(dt.timezone.utc)
    h, m = map(int, s.split(":"))
    t = now.replace(hour=h, minute=m, second=0, microsecond=0)
    return t.timestamp()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=["all", "datagen", "features", "train", "export"])
    ap.add_argument("--workdir", default="/work/train_run")
    ap.add_argument("--model", default=None, help="target HF folder (default: the embedded SmolLM2)")
    ap.add_argument("--deadline", default=None, help="HH:MM UTC today; every stage respects it")
    ap.add_argument("--n", type=int, default=3000, help="prompts to generate answers for")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--datagen-minutes", type=float, default=25.0, help="datagen stops after this")
    ap.add_argument("--max-new-tokens", type=int, default=224)
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument("--num-layers", type=int, default=2)
    ap.add_argument("--num-context-layers", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--anchors", type=int, default=8, help="anchors per training sequence")
    ap.add_argument("--seqs", type=int, default=16, help="sequences per training step")
    ap.add_argument("--negatives", type=int, default=8192, help="sampled out-of-answer-vocab negatives per step")
    ap.add_argument("--gamma", type=float, default=4.0, help="loss weight of block position k: exp(-(k-1)/gamma)")
    ap.add_argument("--ckpt-minutes", type=float, default=3.0)
    ap.add_argument("--export-margin-minutes", type=float, default=4.0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--out", default=DRAFTER_DIR, help="export folder")
    a = ap.parse_args(argv)
    import torch

    from sglang_dflash.cpu_serving import CPU_ENV

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", CPU_ENV["OMP_NUM_THREADS"])))
    if a.model is None:
        from sglang_dflash.embedded import derive

        a.model = derive()
    deadline = parse_deadline(a.deadline)
    cmd = "python -m sglang_dflash.train " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    print("reproduce:", cmd, file=sys.stderr, flush=True)
    os.makedirs(a.workdir, exist_ok=True)
    if a.stage in ("all", "datagen"):
        from sglang_dflash.train import datagen

        stop = time.time() + a.datagen_minutes * 60
        if deadline:
            stop = min(stop, deadline - 40 * 60)
        datagen.run(a.workdir, a.model, a.n, a.seed, a.gen_batch, a.max_new_tokens, deadline=stop)
    if a.stage in ("all", "features"):
        from sglang_dflash.train import features

        features.run(a.workdir, a.model, a.num_context_layers)
    if a.stage in ("all", "train"):
        from sglang_dflash.train import trainer

        stop = deadline - a.export_margin_minutes * 60 if deadline else None
        trainer.run(
            a.workdir,
            a.model,
            num_layers=a.num_layers,
            block_size=a.block_size,
            steps=a.steps,
            lr=a.lr,
            anchors=a.anchors,
            seqs=a.seqs,
            ckpt_minutes=a.ckpt_minutes,
            deadline=stop,
            negatives=a.negatives,
            gamma=a.gamma,
            resume=a.resume or a.stage == "all",
            command=cmd,
        )
    if a.stage in ("all", "export"):
        from sglang_dflash.train import export

        export.run(a.workdir, a.model, a.out, command=cmd)


if __name__ == "__main__":
    main()
