"""Stage 1: the target's own greedy answers to our prompts, through SGLang's offline Engine.

python -m sglang_dflash.train datagen --workdir W [--n N] [--deadline HH:MM]

Plain decoding, temperature 0; with `--datagen-draft DRAFTER` through our DFLASH worker instead
(lossless, so the same greedy chains, at the speculative rate). Writes W/data.jsonl, one line per prompt:
{"id", "family", "split", "prompt_ids": [...], "answer_ids": [...]} (answer_ids as generated, the
final <|im_end|> included when the model stopped). Resumable: ids already in any answer file are
skipped. On CPU the Engine runs with the settings of sglang_dflash/cpu_serving.py.
Sharded (--shard K --shards N): process K answers every N-th prompt into W/data.K.jsonl (K = 0:
data.jsonl), so N processes, one per core, generate side by side: one Engine decodes on one core.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import sys
import time

from sglang_dflash.resumable_jsonl import append_rows, done_ids
from sglang_dflash.train.prompts import generate


def answer_files(workdir: str) -> list[str]:
    """Every shard's answer file, data.jsonl first."""
    shards = glob.glob(os.path.join(workdir, "data.*.jsonl"))
    return [os.path.join(workdir, "data.jsonl")] + sorted(shards, key=lambda f: int(f.split(".")[-2]))


def shard_prompts(
    n: int,
    seed: int,
    shard: int,
    shards: int,
    done: set,
    source: str = "templates",
    exclude=frozenset(),
    followup_of: str | None = None,
    decode=None,
) -> list[dict]:
    """Shard `shard` of `shards`: every shards-th of the first n prompts, those not answered yet.
    source: "templates" (prompts.py), "corpus" (the corpus documents' user turns, those in
    `exclude` left out), "long" (long_prompts.py: whole files and documents, then a question) or
    "followup" (followup_prompts.py: a second turn after the answers in `followup_of`; decode: the
    tokenizer's ids -> text)."""
    if source == "followup":
        from sglang_dflash.train.followup_prompts import followup_prompts, read_answers

        if not followup_of:
            raise ValueError("--prompts followup needs --followup-of EARLIER_WORKDIR (an earlier datagen's answers)")
        prompts = followup_prompts(read_answers(followup_of), seed, decode)[:n]
    elif source == "corpus":
        from sglang_dflash.train.corpus import ask_prompts

        prompts = ask_prompts(seed, exclude)[:n]
    elif source == "long":
        from sglang_dflash.train.long_prompts import long_prompts

        prompts = long_prompts(seed)[:n]
    elif source == "templates":
        prompts = generate(n, seed)
    else:
        raise ValueError(f"--prompts {source!r}: use 'templates', 'corpus', 'long' or 'followup'")
    return [p for i, p in enumerate(prompts) if i % shards == shard and p["id"] not in done]


def make_engine(model: str, dtype: str, max_total_tokens: int, draft: str | None = None):
    """SGLang's offline Engine for the target; with draft (a drafter folder) DFLASH speculation."""
    import torch

    from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

    install_cpu_shims()  # before sglang.Engine imports sgl_kernel
    import sglang

    kw = dict(model_path=model, dtype=dtype, log_level="warning", random_seed=0)
    if draft:
        kw.update(speculative_algorithm="DFLASH", speculative_draft_model_path=draft)
    if not torch.cuda.is_available():
        from sglang_dflash.cpu_serving import engine_kwargs, set_cpu_env

        set_cpu_env()
        kw.update(engine_kwargs(max_total_tokens=max_total_tokens))
    return sglang.Engine(**kw)


def run(
    workdir: str,
    model: str,
    n: int,
    seed: int = 0,
    batch_size: int = 64,
    max_new_tokens: int = 224,
    dtype: str = "bfloat16",
    deadline: float | None = None,
    max_total_tokens: int = 32768,
    shard: int = 0,
    shards: int = 1,
    source: str = "templates",
    exclude=frozenset(),
    draft: str | None = None,
    followup_of: str | None = None,
) -> dict:
    """Generate answers for the first n prompts (this shard's) of `source` (shard_prompts); stop
    starting new batches after `deadline` (epoch s); draft: decode with DFLASH speculation."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    os.makedirs(workdir, exist_ok=True)
    out_path = os.path.join(workdir, f"data.{shard}.jsonl" if shard else "data.jsonl")
    done = set().union(*(done_ids(f) for f in answer_files(workdir)))
    tok = AutoTokenizer.from_pretrained(model)
    decode = functools.partial(tok.decode, skip_special_tokens=True)
    todo = shard_prompts(n, seed, shard, shards, done, source, exclude, followup_of, decode)
    stats = {"skipped": len(done), "written": 0, "tokens": 0, "wall_s": 0.0}
    if not todo:
        return stats
    eng = make_engine(model, dtype, max_total_tokens, draft)
    sp = {"max_new_tokens": max_new_tokens, "temperature": 0}
    t0 = time.time()
    bar = tqdm(total=len(todo), unit="seq", desc="datagen", mininterval=5)
    with append_rows(out_path) as write:
        for i in range(0, len(todo), batch_size):
            if deadline and time.time() > deadline:
                print(f"datagen: deadline reached after {stats['written']} sequences", file=sys.stderr)
                break
            chunk = todo[i : i + batch_size]
            ids = [tok.apply_chat_template(p["messages"], tokenize=True, add_generation_prompt=True) for p in chunk]
            ids = [list(x["input_ids"]) if isinstance(x, dict) or hasattr(x, "keys") else list(x) for x in ids]
            res = eng.generate(input_ids=ids, sampling_params=sp)
            for p, pid, o in zip(chunk, ids, res):
                rec = {
                    "id": p["id"],
                    "family": p["family"],
                    "split": p["split"],
                    "prompt_ids": pid,
                    "answer_ids": list(o["output_ids"]),
                    "finish": (o["meta_info"].get("finish_reason") or {}).get("type"),
                }
                write(rec)
                stats["tokens"] += len(rec["answer_ids"])
            stats["written"] += len(chunk)
            el = time.time() - t0
            bar.update(len(chunk))
            bar.set_postfix(tok_s=f"{stats['tokens'] / el:.1f}")
    bar.close()
    stats["wall_s"] = round(time.time() - t0, 1)
    stats["tok_s"] = round(stats["tokens"] / max(stats["wall_s"], 1e-9), 1)
    eng.shutdown()
    print("datagen:", json.dumps(stats), file=sys.stderr)
    return stats
