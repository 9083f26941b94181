"""Datagen prompts of a second turn: a conversation an earlier datagen answered (its prompt, then the
target's own answer as a chat client sends it back, as text), then a follow-up question. The target
answers in the context of its own earlier answer, as multi-turn chat traffic does, so what it answers
about is text no template wrote (`train datagen --prompts followup --followup-of EARLIER_WORKDIR`,
with the earlier run's --seed). Only the earlier run's train split and complete answers are followed
up, so every held-out and unseen set stays as it was."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Callable

from sglang_dflash.train import corpus, prompts
from sglang_dflash.train.long_prompts import LONG_PREFIX, long_prompts

FOLLOWUP_PREFIX = "followup-"
CODE_FOLLOWUPS = (
    "Add error handling to that code.",
    "Write two short tests for it.",
    "Explain the trickiest line of it.",
    "Rewrite it to be shorter and clearer.",
    "What is its time complexity, and why?",
)
PROSE_FOLLOWUPS = (
    "Can you give a concrete example?",
    "Summarize that in two sentences.",
    "What is a common mistake people make here?",
    "Explain it again for a beginner.",
    "What would you suggest I try next?",
)
MIN_ANSWER_TOKENS = 16


def first_turns(ids: set[str], seed: int) -> dict[str, dict]:
    """The earlier prompts `ids` (templates 'p<i>', corpus 'ask-...', long 'long-...') as their
    sources give them at the earlier run's seed: {id: {"family", "messages", ...}}."""
    out: dict[str, dict] = {}
    templated = [int(i[1:]) for i in ids if i[:1] == "p" and i[1:].isdigit()]
    if templated:
        out |= {p["id"]: p for p in prompts.generate(max(templated) + 1, seed)}
    if any(i.startswith(corpus.ASK_PREFIX) for i in ids):
        out |= {p["id"]: p for p in corpus.ask_prompts(seed)}
    if any(i.startswith(LONG_PREFIX) for i in ids):
        out |= {p["id"]: p for p in long_prompts(seed)}
    return {i: out[i] for i in ids if i in out}


def followup_prompts(records: list[dict], seed: int, decode: Callable[[list[int]], str]) -> list[dict]:
    """records: an earlier datagen's rows ({"id", "family", "split", "answer_ids", "finish"});
    decode: answer token ids -> text (the tokenizer's, special tokens skipped) ->
    {"id": "followup-<earlier id>", "family": "followup-<earlier family>", "split": "train",
    "messages": earlier messages + [assistant answer, user follow-up]}, in the records' order. The
    follow-up is picked by the answer's hash from the code questions when it holds a code fence."""
    keep = [r for r in records if r["split"] == "train" and r.get("finish") == "stop"]
    keep = [r for r in keep if len(r["answer_ids"]) >= MIN_ANSWER_TOKENS]
    turns = first_turns({r["id"] for r in keep}, seed)
    # templated ids are indices, the same at any seed: a family that differs says the seed does
    wrong = sorted(r["id"] for r in keep if r["id"] not in turns or turns[r["id"]]["family"] != r["family"])
    if wrong:
        raise ValueError(
            f"--followup-of: {len(wrong)} earlier prompts (e.g. {wrong[0]!r}) are not what their sources "
            "give at this --seed: pass the earlier run's --seed"
        )
    out = []
    for r in keep:
        answer = decode(r["answer_ids"]).strip()
        h = int(hashlib.sha1(answer.encode()).hexdigest()[:8], 16)
        qs = CODE_FOLLOWUPS if "```" in answer else PROSE_FOLLOWUPS
        msgs = turns[r["id"]]["messages"] + [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": qs[h % len(qs)]},
        ]
        out.append({"id": FOLLOWUP_PREFIX + r["id"], "family": FOLLOWUP_PREFIX + r["family"], "split": "train",
                    "messages": msgs})  # fmt: skip
    return out


def read_answers(workdir: str) -> list[dict]:
    """Every answer row of an earlier datagen workdir (all its shards), data.jsonl first."""
    from sglang_dflash.train.datagen import answer_files

    rows = []
    for path in answer_files(workdir):
        if os.path.exists(path):
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise ValueError(f"--followup-of {workdir}: no datagen answers there (data.jsonl, data.K.jsonl)")
    return rows
