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

import argparse
import datetime as dt
import os
import shlex
import subprocess
import sys
import time

DRAFTER_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "drafters", "smollm2-135m-instruct-dflash"
)


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "stage", choices=["all", "corpus", "datagen", "features", "train", "export", "cut", "mix", "grow", "dflash2"]
    )
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
        choices=["templates", "corpus", "long"],
        default="templates",
        help="datagen's prompts: prompts.py's templates, the corpus documents' user turns, or long "
        "prompts (a whole installed file or document, then a question: long_prompts.py)",
    )
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
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)  # our own stages; SGLang's Engine (datagen) keeps its CPU settings
    if a.model is None:
        from sglang_dflash.embedded import derive

        a.model = derive()
    deadline = parse_deadline(a.deadline)
    if a.train_minutes:  # an exact budget (equal-budget arms), the export margin not taken from it
        deadline = time.time() + a.train_minutes * 60 + (a.export_margin_minutes if a.stage == "all" else 0) * 60
        a.export_margin_minutes = a.export_margin_minutes if a.stage == "all" else 0.0
    cmd = "python -m sglang_dflash.train " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    print("reproduce:", cmd, file=sys.stderr, flush=True)
    os.makedirs(a.workdir, exist_ok=True)
    leave = deadline - (a.min_train_minutes + a.export_margin_minutes) * 60 if deadline else None
    from sglang_dflash.resumable_jsonl import read_rows

    held = {r["source"] for r in read_rows(a.exclude_docs)} if a.exclude_docs else set()
    if a.stage in ("all", "corpus") and not a.no_text:
        from sglang_dflash.train import corpus

        corpus.write(a.workdir, a.model, a.text_answer_tokens, a.seed, exclude=held)
    gen_stop = time.time() + a.datagen_minutes * 60
    gen_stop = min(gen_stop, leave or gen_stop)
    if a.stage == "datagen":
        from sglang_dflash.train import datagen

        why = "--datagen-minutes" if gen_stop < (leave or gen_stop + 1) else "--deadline less the training margins"
        print(f"datagen: stops at {time.strftime('%H:%M', time.gmtime(gen_stop))} UTC ({why})", file=sys.stderr)

        datagen.run(
            a.workdir,
            a.model,
            a.n,
            a.seed,
            a.gen_batch,
            a.max_new_tokens,
            deadline=gen_stop,
            shard=a.shard,
            shards=a.shards,
            source=a.prompts,
            exclude=held,
            draft=a.datagen_draft,
        )
    if a.stage in ("all", "features"):
        from sglang_dflash.train import features

        gen = None
        if a.stage == "all":  # datagen: SGLang's Engine decodes on one core per process
            hhmm = time.strftime("%H:%M", time.gmtime(gen_stop + 60))
            argv_gen = ["datagen", "--workdir", a.workdir, "--model", a.model, "--n", str(a.n), "--seed", str(a.seed)]
            argv_gen += ["--gen-batch", str(a.gen_batch), "--max-new-tokens", str(a.max_new_tokens)]
            argv_gen += ["--datagen-minutes", str((gen_stop - time.time()) / 60), "--deadline", hhmm]
            argv_gen += ["--min-train-minutes", "0", "--export-margin-minutes", "0", "--shards", str(a.datagen_procs)]
            argv_gen += ["--prompts", a.prompts] + (["--exclude-docs", a.exclude_docs] if a.exclude_docs else [])
            argv_gen += ["--datagen-draft", a.datagen_draft] if a.datagen_draft else []
            from sglang_dflash.env import CPU_THREADS

            # one OpenMP thread whatever the caller exported, the shard's scheduler too (srt/cpu_threads.py):
            # two spinning threads beside the features' thread on 2 cores cut datagen from 86 to 30 tokens/s
            env = {**os.environ, "OMP_NUM_THREADS": "1", CPU_THREADS.name: "1"}
            procs = [
                subprocess.Popen([sys.executable, "-m", "sglang_dflash.train", *argv_gen, "--shard", str(k)], env=env)
                for k in range(a.datagen_procs)
            ]
            if a.datagen_procs > 1:  # every core decodes (2 x 138 tokens/s vs 92 beside the features), then features
                for p in procs:
                    p.wait()
            else:  # one datagen process beside the features (the other core)
                gen = procs[0]
                torch.set_num_threads(1)
        from sglang_dflash.train.corpus import ID_PREFIX

        stop = time.time() + a.features_minutes * 60
        reused = {i for w in a.extra_features for i in features.done_ids(os.path.join(w, "features"))}
        features.run(
            a.workdir,
            a.model,
            a.num_context_layers,
            follow_pid=gen and gen.pid,
            deadline=min(stop, leave or stop),
            skip={i for i in reused if i.startswith(ID_PREFIX)},  # documents are content-hashed; answers are not
        )
        if gen is not None:
            gen.wait()
            torch.set_num_threads(a.threads)
    if a.stage in ("all", "train"):
        from sglang_dflash.train import trainer

        stop = deadline - a.export_margin_minutes * 60 if deadline else None
        trainer.run(
            trainer.TrainConfig(
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
                draft_vocab=a.draft_vocab,
                resume=a.resume or a.stage == "all",
                command=cmd,
                no_text=a.no_text,
                init_from=a.init_from,
                extra_features=a.extra_features,
                warmup=a.warmup_steps,
                keep_draft_vocab=a.keep_draft_vocab,
                distil=a.distil,
                distil_temperature=a.distil_temperature,
            )
        )
    if a.stage in ("all", "export"):
        from sglang_dflash.train import export

        export.run(
            a.workdir, a.model, a.out, cmd, seed=a.seed, max_new_tokens=a.max_new_tokens, draft_vocab=a.export_vocab
        )
    if a.stage == "mix":  # (1 - w) x --drafter (the parent) + w x --init-from (the child): interpolate.py
        from sglang_dflash.train.interpolate import interpolate

        interpolate(a.drafter, a.init_from, a.out, a.mix_weight)
    if a.stage == "grow":  # --drafter (the parent) with --num-layers layers, the same forward: grow.py
        from sglang_dflash.train.grow import grow

        grow(a.drafter, a.out, a.num_layers, a.grow_init, a.model)
    if a.stage == "dflash2":  # --drafter (DFlash 1) as a DFlash 2 drafter with the same drafts: dflash2.py
        from sglang_dflash.train.dflash2 import upgrade

        upgrade(a.drafter, a.out, rank=a.selector_rank, top_k=a.selector_top_k, seed=a.seed)
    if a.stage == "cut":
        from sglang_dflash.train import vocab_cut

        vocab_cut.cut_checkpoint(a.drafter, a.workdir, a.model, a.out, a.export_vocab)


if __name__ == "__main__":
    main()
