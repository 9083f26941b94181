"""Stage 2: target hidden states at the drafter's target_layer_ids, stored as bf16 shards.

Reads W/data.jsonl (the target's answers; datagen shards' data.K.jsonl too) and W/text.jsonl (corpus.py: real text), runs the target
(HF transformers, `output_hidden_states=True`) over prompt + answer one sequence at a time (no
padding), and writes W/features/shard_NNNNN.pt:
{"ids": [str], "split": [str], "offsets": int64 [n+1], "answer_start": int64 [n],
 "tokens": int64 [sum T], "feats": bf16 [sum T, K*H], "labels": int64 [sum T],
 "topk_ids": int32 [sum T, k], "topk_logp": float32 [sum T, k]} (rows of sequence i:
offsets[i]:offsets[i+1]). labels[t] is the target's greedy token after position t: the next token
for datagen's answers (they are the target's greedy output), the argmax of the same forward's
logits over a text document's answer part (-100 where there is none). topk_*: the target's k most
likely next tokens after t and their log-probabilities (T=1; the rest of the mass is
1 - sum(exp)), answer positions only (ids -1 before): the distillation targets (trainer --distil).
The layer-id convention comes from sglang_dflash.model.config only. Resumable: ids already in a shard are
skipped; with follow_pid it keeps polling data.jsonl while that (datagen) process is alive.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

import torch

from sglang_dflash.model.config import default_target_layer_ids, hf_hidden_state_index
from sglang_dflash.resumable_jsonl import read_rows
from sglang_dflash.train.blocks import Seq


def load_target(model: str, dtype=torch.bfloat16, keep_layers: int | None = None):
    """The HF target; with keep_layers only the first keep_layers decoder layers are kept."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval().requires_grad_(False)
    if keep_layers is not None:
        m.model.layers = m.model.layers[:keep_layers]
    return m


TOPK = 32  # distillation targets kept per position (the rest of the mass as one number)


@torch.inference_mode()
def sequence_features(
    target,
    tokens: torch.Tensor,
    layer_ids: list[int],
    label_from: int | None = None,
    topk: int = 0,
    topk_from: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """tokens [T] -> features [T, K*H] (the outputs of decoder layers `layer_ids`, z-lab ids,
    concatenated in the order given: the order fc expects), labels [T]: the next token, or with
    label_from the target's argmax at positions >= label_from (-100 before), and with topk > 0 the
    target's topk most likely next tokens at positions >= topk_from: (ids int32 [T, topk], -1
    before; log-probs float32 [T, topk], -inf before), all from the same forward."""
    hs = target.model(input_ids=tokens[None], output_hidden_states=True).hidden_states
    last = len(hs) - 1  # HF applies the final norm to this one: never use it as a feature
    idx = [hf_hidden_state_index(i) for i in layer_ids]
    assert max(idx) < last, f"layer ids {layer_ids} need more layers than the {last} kept"
    feats = torch.cat([hs[i][0] for i in idx], dim=-1)
    labels = torch.cat([tokens[1:], torch.tensor([-100])])
    need = [x for x in (label_from, topk_from if topk else None) if x is not None]
    start = min(need, default=len(tokens))
    logits = target.lm_head(hs[last][0, start:]).float() if need else None  # [T - start, V]
    if label_from is not None:
        labels = torch.full_like(tokens, -100)
        labels[label_from:] = logits[label_from - start :].argmax(-1)
    soft = None
    if topk:
        logp, ids = logits[topk_from - start :].log_softmax(-1).topk(topk, dim=-1)
        soft = (torch.full((len(tokens), topk), -1, dtype=torch.int32), torch.full((len(tokens), topk), -torch.inf))
        soft[0][topk_from:], soft[1][topk_from:] = ids.int(), logp
    return feats, labels, soft


def layer_ids_for(model: str, num_context_layers: int) -> list[int]:
    with open(os.path.join(model, "config.json")) as f:
        return default_target_layer_ids(json.load(f)["num_hidden_layers"], num_context_layers)


def done_ids(fdir: str) -> set:
    ids = set()
    for f in sorted(glob.glob(os.path.join(fdir, "shard_*.pt"))):
        ids.update(torch.load(f, mmap=True)["ids"])  # mmap: the ids without reading the features
    return ids


def read_new(workdir: str, done: set) -> list[dict]:
    """Complete rows not yet featurized: datagen's answers (datagen may still be appending to its
    file), then the text documents."""
    from sglang_dflash.train.datagen import answer_files

    files = answer_files(workdir) + [os.path.join(workdir, "text.jsonl")]
    rows = [r for name in files for r in read_rows(name)]
    return [r for r in rows if r["id"] not in done and r["answer_ids"]]


def write_shard(
    fdir: str, recs: list[dict], feats: list[torch.Tensor], labels: list[torch.Tensor], soft: list | None = None
) -> str:
    n = len(glob.glob(os.path.join(fdir, "shard_*.pt")))
    lens = [f.shape[0] for f in feats]
    shard = {
        "ids": [r["id"] for r in recs],
        "split": [r["split"] for r in recs],
        "offsets": torch.tensor([0] + lens).cumsum(0),
        "answer_start": torch.tensor([len(r["prompt_ids"]) for r in recs]),
        "tokens": torch.tensor([t for r in recs for t in r["prompt_ids"] + r["answer_ids"]]),
        "feats": torch.cat(feats).to(torch.bfloat16),
        "labels": torch.cat(labels),
    }
    if soft and all(x is not None for x in soft):
        shard["topk_ids"], shard["topk_logp"] = torch.cat([i for i, _ in soft]), torch.cat([p for _, p in soft])
    path = os.path.join(fdir, f"shard_{n:05d}.pt")
    torch.save(shard, path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child (train all's datagen) has exited
            return False
    except ChildProcessError:  # not our child: ask the kernel whether it exists
        pass
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def run(
    workdir: str,
    model: str,
    num_context_layers: int = 3,
    shard_size: int = 128,
    follow_pid: int | None = None,
    dtype=torch.bfloat16,
    deadline: float | None = None,
    skip: set | frozenset = frozenset(),
    topk: int = TOPK,
) -> dict:
    """Featurize every new row; with a deadline (epoch s) stop starting shards after it. skip: ids
    not to featurize (earlier runs' text documents, whose ids are content hashes, when their
    features are reused through --extra-features). topk: distillation targets per answer position
    (0: none)."""
    fdir = os.path.join(workdir, "features")
    os.makedirs(fdir, exist_ok=True)
    ids = layer_ids_for(model, num_context_layers)
    meta = {"target_layer_ids": ids, "model": model, "dtype": str(dtype)}
    with open(os.path.join(fdir, "meta.json"), "w") as f:
        json.dump(meta, f)
    target = load_target(model, dtype)  # every layer: text documents need the logits too
    done = done_ids(fdir) | set(skip)
    stats = {"sequences": 0, "tokens": 0, "wall_s": 0.0}
    t0 = time.time()
    while True:
        following = alive(follow_pid)  # read before the file so a finished datagen's tail is seen
        new = read_new(workdir, done)
        if following and len(new) < shard_size:
            time.sleep(20)
            continue
        if not new or deadline and time.time() > deadline:
            break
        chunk = new[:shard_size]  # then re-read: datagen's newest answers go before the text documents
        out = [
            sequence_features(
                target,
                torch.tensor(r["prompt_ids"] + r["answer_ids"]),
                ids,
                len(r["prompt_ids"]) if r.get("labels") == "argmax" else None,
                topk,
                len(r["prompt_ids"]),
            )
            for r in chunk
        ]
        feats = [f for f, _, _ in out]
        write_shard(fdir, chunk, feats, [lab for _, lab, _ in out], [s for _, _, s in out])
        done.update(r["id"] for r in chunk)
        stats["sequences"] += len(chunk)
        stats["tokens"] += sum(f.shape[0] for f in feats)
        el = time.time() - t0
        print(
            f"features: {stats['sequences']} seqs, {stats['tokens']} tokens, {stats['tokens'] / el:.0f} tok/s",
            file=sys.stderr,
            flush=True,
        )
    stats["wall_s"] = round(time.time() - t0, 1)
    print("features:", json.dumps(stats), file=sys.stderr)
    return stats


def _shard_seqs(fdir: str):
    for f in sorted(glob.glob(os.path.join(fdir, "shard_*.pt"))):
        s = torch.load(f)
        o = s["offsets"].tolist()
        labels, tk_ids, tk_logp = s.get("labels"), s.get("topk_ids"), s.get("topk_logp")
        for i, sid in enumerate(s["ids"]):
            r = slice(o[i], o[i + 1])
            lab = None if labels is None else labels[r]
            seq = Seq(sid, s["tokens"][r], s["feats"][r], int(s["answer_start"][i]), lab)
            if tk_ids is not None:
                seq.topk_ids, seq.topk_logp = tk_ids[r], tk_logp[r]
            yield s["split"][i], seq


def load_seqs(workdir: str, extra: list[str] | tuple = (), per_dir: dict | None = None) -> tuple[list[Seq], list[Seq]]:
    """The run's own train / held-out sequences, plus the train split of earlier runs' workdirs
    `extra` (their features are reused, not recomputed). Held-out stays the run's own so its curve
    measures prompts no parent saw; a sequence (same tokens) met twice is kept once. The split is a
    content hash (prompts.split_of), so a held-out conversation is held out in every run.
    per_dir, if given, gets the number of train sequences taken from each workdir."""
    with open(os.path.join(workdir, "features", "meta.json")) as f:
        ids = json.load(f)["target_layer_ids"]
    train, held, seen = [], [], set()
    for i, wd in enumerate([workdir, *extra]):
        with open(os.path.join(wd, "features", "meta.json")) as f:
            other = json.load(f)["target_layer_ids"]
        if other != ids:
            raise ValueError(
                f"--extra-features {wd}: its features are target layers {other}, this run's are {ids}; "
                "reuse only runs made with the same --num-context-layers"
            )
        for split, seq in _shard_seqs(os.path.join(wd, "features")):
            key = hash(seq.tokens.numpy().tobytes())
            if key in seen or (i and split == "heldout"):
                continue
            seen.add(key)
            (held if split == "heldout" else train).append(seq)
            if per_dir is not None and split != "heldout":
                per_dir[wd] = per_dir.get(wd, 0) + 1
    return train, held
