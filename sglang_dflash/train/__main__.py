"""Train our own DFlash drafter for the embedded SmolLM2 target, each stage resumable.

python -m sglang_dflash.train all --workdir WORKDIR --deadline 14:40
python -m sglang_dflash.train {corpus,datagen,features,train,export} --workdir W [...]
python -m sglang_dflash.train cut --drafter DIR --workdir W --out DIR2   (reduced draft vocabulary)
python -m sglang_dflash.train mix --drafter PARENT --init-from CHILD --mix-weight 0.7 --out DIR2
python -m sglang_dflash.train grow --drafter PARENT --num-layers 4 --grow-init copy|target --out DIR2
python -m sglang_dflash.train dflash2 --drafter PARENT --out DIR2 [--selector-rank 32 --selector-top-k 8]

Stages: corpus (text documents from this machine, corpus.py), datagen (the target's greedy answers to
generated prompts), features (target features + labels, one prefill per sequence), train, export.
--deadline HH:MM (UTC, today) bounds the whole run: datagen and features stop after their budgets
(and early enough to leave --min-train-minutes of training), training stops at the deadline minus
the export margin, and the best checkpoint (by held-out walk tau) is exported.
"""

from __future__ import annotations

import os
import shlex
import sys

from sglang_dflash.train import stages
from sglang_dflash.train.arguments import DRAFTER_DIR, TOOLS, parse_args, parse_deadline

__all__ = ["DRAFTER_DIR", "main", "parse_deadline"]


def main(argv=None):
    a = parse_args(argv, description=__doc__.split("\n\n")[0])
    import torch

    torch.set_num_threads(a.threads)  # our own stages; SGLang's Engine (datagen) keeps its CPU settings
    if a.model is None:
        from sglang_dflash.embedded import derive

        a.model = derive()
    b = stages.budget(a)
    command = "python -m sglang_dflash.train " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    print("reproduce:", command, file=sys.stderr, flush=True)
    os.makedirs(a.workdir, exist_ok=True)
    if a.stage in ("all", "corpus") and not a.no_text:
        stages.corpus(a, b)
    if a.stage == "datagen":  # under `all`, the features stage runs datagen in subprocesses
        stages.datagen(a, b)
    if a.stage in ("all", "features"):
        stages.features(a, b)
    if a.stage in ("all", "train"):
        stages.train(a, b, command)
    if a.stage in ("all", "export"):
        stages.export(a, command)
    if a.stage in TOOLS:
        stages.tool(a)


if __name__ == "__main__":
    main()
