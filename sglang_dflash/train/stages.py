"""The stages of `python -m sglang_dflash.train`, one function each, in pipeline order, and the
one-shot drafter tools. Each reads the parsed arguments and the run's Budget (when every stage must
stop), imports its own module only when it runs (datagen needs SGLang, the others plain torch)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from sglang_dflash.train.arguments import parse_deadline


@dataclass
class Budget:
    """When each stage stops (time.time() seconds; None: unbounded)."""

    deadline: float | None  # the whole run: training stops at it less the export margin
    leave: float | None  # datagen and features stop by here, leaving the training and export margins
    gen_stop: float  # datagen: --datagen-minutes from now, or `leave` if sooner
    held: set  # documents kept out of the corpus and its prompts (--exclude-docs)


def budget(a) -> Budget:
    """The run's stops; --train-minutes is an exact training budget (the equal-budget arms), the
    export margin added on top when the export runs in the same process. Adjusts a's margin."""
    deadline = parse_deadline(a.deadline)
    if a.train_minutes:
        margin = a.export_margin_minutes if a.stage == "all" else 0.0
        deadline = time.time() + (a.train_minutes + margin) * 60
        a.export_margin_minutes = margin
    leave = deadline - (a.min_train_minutes + a.export_margin_minutes) * 60 if deadline else None
    gen_stop = time.time() + a.datagen_minutes * 60
    gen_stop = min(gen_stop, leave or gen_stop)
    from sglang_dflash.resumable_jsonl import read_rows

    held = {r["source"] for r in read_rows(a.exclude_docs)} if a.exclude_docs else set()
    return Budget(deadline, leave, gen_stop, held)


def corpus(a, b: Budget) -> None:
    from sglang_dflash.train import corpus

    corpus.write(a.workdir, a.model, a.text_answer_tokens, a.seed, exclude=b.held)


def datagen(a, b: Budget) -> None:
    """The target's greedy answers, in this process (one shard of --shards)."""
    from sglang_dflash.train import datagen

    why = "--datagen-minutes" if b.gen_stop < (b.leave or b.gen_stop + 1) else "--deadline less the training margins"
    print(f"datagen: stops at {time.strftime('%H:%M', time.gmtime(b.gen_stop))} UTC ({why})", file=sys.stderr)
    datagen.run(
        a.workdir,
        a.model,
        a.n,
        a.seed,
        a.gen_batch,
        a.max_new_tokens,
        deadline=b.gen_stop,
        shard=a.shard,
        shards=a.shards,
        source=a.prompts,
        exclude=b.held,
        draft=a.datagen_draft,
        followup_of=a.followup_of,
    )


def start_datagen_shards(a, b: Budget) -> subprocess.Popen | None:
    """`all`: datagen in --datagen-procs subprocesses (SGLang's Engine decodes on one core each).
    Several: they run to the end first. One: it is returned, to run beside the features."""
    hhmm = time.strftime("%H:%M", time.gmtime(b.gen_stop + 60))
    argv = ["datagen", "--workdir", a.workdir, "--model", a.model, "--n", str(a.n), "--seed", str(a.seed)]
    argv += ["--gen-batch", str(a.gen_batch), "--max-new-tokens", str(a.max_new_tokens)]
    argv += ["--datagen-minutes", str((b.gen_stop - time.time()) / 60), "--deadline", hhmm]
    argv += ["--min-train-minutes", "0", "--export-margin-minutes", "0", "--shards", str(a.datagen_procs)]
    argv += ["--prompts", a.prompts] + (["--exclude-docs", a.exclude_docs] if a.exclude_docs else [])
    argv += ["--datagen-draft", a.datagen_draft] if a.datagen_draft else []
    argv += ["--followup-of", a.followup_of] if a.followup_of else []
    from sglang_dflash.env import CPU_THREADS

    # one OpenMP thread whatever the caller exported, the shard's scheduler too (cpu/cpu_threads.py):
    # spinning threads beside the features' thread would take its core
    env = {**os.environ, "OMP_NUM_THREADS": "1", CPU_THREADS.name: "1"}
    procs = [
        subprocess.Popen([sys.executable, "-m", "sglang_dflash.train", *argv, "--shard", str(k)], env=env)
        for k in range(a.datagen_procs)
    ]
    if a.datagen_procs > 1:  # every core decodes, then the features
        for p in procs:
            p.wait()
        return None
    return procs[0]  # one datagen process beside the features (the other core)


def features(a, b: Budget) -> None:
    """Target features and labels; under `all`, beside (or after) the datagen shards."""
    import torch

    from sglang_dflash.train import features
    from sglang_dflash.train.corpus import ID_PREFIX

    gen = start_datagen_shards(a, b) if a.stage == "all" else None
    if gen is not None:
        torch.set_num_threads(1)
    stop = time.time() + a.features_minutes * 60
    reused = {i for w in a.extra_features for i in features.done_ids(os.path.join(w, "features"))}
    features.run(
        a.workdir,
        a.model,
        a.num_context_layers,
        follow_pid=gen and gen.pid,
        deadline=min(stop, b.leave or stop),
        skip={i for i in reused if i.startswith(ID_PREFIX)},  # documents are content-hashed; answers are not
    )
    if gen is not None:
        gen.wait()
        torch.set_num_threads(a.threads)


def train(a, b: Budget, command: str) -> None:
    from sglang_dflash.train import trainer

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
            deadline=b.deadline - a.export_margin_minutes * 60 if b.deadline else None,
            negatives=a.negatives,
            gamma=a.gamma,
            draft_vocab=a.draft_vocab,
            resume=a.resume or a.stage == "all",
            command=command,
            no_text=a.no_text,
            init_from=a.init_from,
            extra_features=a.extra_features,
            warmup=a.warmup_steps,
            keep_draft_vocab=a.keep_draft_vocab,
            distil=a.distil,
            distil_temperature=a.distil_temperature,
        )
    )


def export(a, command: str) -> None:
    from sglang_dflash.train import export

    export.run(
        a.workdir, a.model, a.out, command, seed=a.seed, max_new_tokens=a.max_new_tokens, draft_vocab=a.export_vocab
    )


def tool(a) -> None:
    """The one-shot transforms of an exported drafter (--drafter, the parent) into --out."""
    if a.stage == "mix":  # (1 - w) x the parent + w x --init-from (the child): interpolate.py
        from sglang_dflash.train.interpolate import interpolate

        interpolate(a.drafter, a.init_from, a.out, a.mix_weight)
    elif a.stage == "grow":  # the parent with --num-layers layers, the same forward: grow.py
        from sglang_dflash.train.grow import grow

        grow(a.drafter, a.out, a.num_layers, a.grow_init, a.model)
    elif a.stage == "dflash2":  # a DFlash 1 parent as a DFlash 2 drafter with the same drafts: dflash2.py
        from sglang_dflash.train.dflash2 import upgrade

        upgrade(a.drafter, a.out, rank=a.selector_rank, top_k=a.selector_top_k, seed=a.seed)
    elif a.stage == "cut":  # a reduced draft vocabulary: vocab_cut.py
        from sglang_dflash.train import vocab_cut

        vocab_cut.cut_checkpoint(a.drafter, a.workdir, a.model, a.out, a.export_vocab)
