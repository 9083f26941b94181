"""A held-out set from documents a training run never saw: the target's own greedy answers to the
prompts of corpus documents (sglang_dflash/train/corpus.py: "implement this standard-library
function", "continue this text") that the run's features stage did not reach. The split of
`train/prompts.py` measures templated prompts like the training ones; this one measures how a
drafter does on prompts unlike its templates (issue 14: the shipped drafter generalised poorly).

    python bench/unseen_set.py --from WORKDIR [WORKDIR2 ...] [--seen-prefix 0:2944] --out UNSEEN_DIR
    python bench/unseen_set.py --fresh --per-family 55 --out UNSEEN_DIR
    python bench/unseen_set.py --templated N | --long N --out DIR   (the other walk sets, same format)

--fresh: kinds of text no training run has ever read (corpus.py reads Python and /usr/share/doc
only): C headers under /usr/include, JavaScript under /usr/lib/node_modules, the Python reference
topics (pydoc_data) to continue, and chat questions about those topics; unseen by construction,
whatever runs a drafter descends from.

A drafter warm-started through several runs has seen the documents of all of them: pass every
run's workdir to --from, and --seen-prefix SEED:N for a run whose features are not on this machine
(its features stage took the first N documents of corpus.documents(SEED), which is the order
text.jsonl is written in). OUT/picked.jsonl lists the chosen documents first ({"id", "source"}),
so a training run can exclude them (--exclude-docs) before their answers exist.
Writes OUT/data.jsonl (datagen's row format, every row split "heldout") and OUT/features/ (the
features stage), so bench/drafter_arms.py --workdir OUT measures walk tau on it. Resumable.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from sglang_dflash.embedded import derive
from sglang_dflash.resumable_jsonl import append_rows, done_ids, read_rows
from sglang_dflash.train import datagen, features


def pick(srcs: list[str], per_family: int, seed: int = 0, seen_prefix: list[str] = ()) -> list[dict]:
    """per_family corpus rows of each family whose ids no run in srcs featurized (nor the first N
    documents of corpus.documents(S) for each "S:N" in seen_prefix); deterministic."""
    from sglang_dflash.train import corpus

    seen = {i for src in srcs for i in features.done_ids(os.path.join(src, "features"))}
    for spec in seen_prefix:
        s, n = map(int, spec.split(":"))
        seen.update(d["id"] for d in corpus.documents(s, lib=False)[:n])
    rows = [r for r in read_rows(os.path.join(srcs[0], "text.jsonl")) if r["id"] not in seen]
    out = []
    for fam in sorted({r["family"] for r in rows}):
        mine = [r for r in rows if r["family"] == fam]
        out += random.Random(seed).sample(mine, min(per_family, len(mine)))
    return out


def _opening(path: str, lines: int = 30) -> str | None:
    """The first `lines` lines of a source file with enough body after them, else None."""
    try:
        text = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError):
        return None
    rows = text.splitlines()
    if len(rows) < 2 * lines or max(map(len, rows[:lines]), default=0) > 200:  # short or minified
        return None
    return "\n".join(rows[:lines])


def fresh(per_family: int, seed: int = 0) -> list[dict]:
    """per_family prompts of each fresh kind: {"id", "family", "messages": [user]}; deterministic."""
    import glob
    import hashlib

    from pydoc_data.topics import topics

    fams: dict[str, list[str]] = {"c-header": [], "javascript": [], "pydoc": [], "chat": []}
    for fam, pat, lang in (
        ("c-header", "/usr/include/**/*.h", "c"),
        ("javascript", "/usr/lib/node_modules/**/*.js", "js"),
    ):
        for path in sorted(glob.glob(pat, recursive=True)):
            head = _opening(path)
            if head:
                fams[fam].append(
                    f"Continue this {'C header' if lang == 'c' else 'JavaScript file'}:\n```{lang}\n{head}\n```"
                )
    for name in sorted(topics):
        paras = [p.strip() for p in topics[name].split("\n\n") if len(p.strip()) > 80]
        if len(paras) >= 3:
            fams["pydoc"].append(f"Continue this Python documentation:\n\n{paras[0][:600]}")
            fams["chat"].append(
                f'In Python, what is "{name.replace("-", " ")}" about? Explain it with a short example.'
            )
    out = []
    for fam, users in fams.items():
        for user in random.Random(f"{seed}-{fam}").sample(users, min(per_family, len(users))):
            h = hashlib.sha1(user.encode()).hexdigest()[:16]
            out.append({"id": f"fresh-{h}", "family": f"fresh-{fam}", "messages": [{"role": "user", "content": user}]})
    return out


def fresh_rows(per_family: int, model: str) -> list[dict]:
    """fresh() as unseen rows: {"id", "source", "family", "prompt_ids"} (the chat template applied)."""
    return chat_rows([{**d, "id": d["id"].removeprefix("fresh-")} for d in fresh(per_family)], model)


def interleaved_prompts(model: str, n: int) -> list[list[int]]:
    """n prompt token lists of fresh() (served benches: bench/real_bench.py --prompts unseen), the
    families interleaved."""
    rows = fresh_rows((n + 3) // 4, model)
    fams = sorted({r["family"] for r in rows})
    by = [[r["prompt_ids"] for r in rows if r["family"] == f] for f in fams]
    return [ids for group in zip(*by) for ids in group][:n]


def other_rows(kind: str, n: int, model: str, seed: int = 9) -> list[dict]:
    """Walk sets beside the unseen one, as rows like fresh_rows': "templated" the first n held-out
    prompts of train/prompts.py (held out by content hash in every run), "long" the first n of
    train/long_prompts.py (a whole installed file or document, then a question; only the long arm
    trains on them)."""
    if kind == "templated":
        from sglang_dflash.train.prompts import generate

        picked = [p for p in generate(40 * n, seed) if p["split"] == "heldout"][:n]
    else:
        from sglang_dflash.train.long_prompts import long_prompts

        picked = long_prompts(seed)[:n]
    return chat_rows(picked, model)


def chat_rows(prompts: list[dict], model: str) -> list[dict]:
    """{"id", "family", "messages"} -> {"id", "family", "prompt_ids"} (the chat template applied)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    rows = []
    for d in prompts:
        ids = tok.apply_chat_template(d["messages"], tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
        rows.append({"id": d["id"], "family": d["family"], "prompt_ids": ids})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", nargs="+", help="training workdirs (text.jsonl, features/)")
    ap.add_argument("--fresh", action="store_true", help="kinds of text no training run reads (fresh())")
    ap.add_argument("--templated", type=int, default=0, help="N: the first N templated held-out prompts instead")
    ap.add_argument("--long", type=int, default=0, help="N: the first N long-context prompts instead")
    ap.add_argument("--seen-prefix", nargs="*", default=[], help="SEED:N, a run's documents not on this machine")
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-family", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--pick-only", action="store_true", help="write OUT/picked.jsonl and stop")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    model, path = derive(), os.path.join(a.out, "data.jsonl")
    done = done_ids(path)
    if [bool(a.src), a.fresh, a.templated > 0, a.long > 0].count(True) != 1:
        ap.error("give one of --from WORKDIR ..., --fresh, --templated N, --long N")
    if a.templated or a.long:
        picked = other_rows("templated" if a.templated else "long", a.templated or a.long, model)
    else:
        picked = fresh_rows(a.per_family, model) if a.fresh else pick(a.src, a.per_family, seen_prefix=a.seen_prefix)
    with open(os.path.join(a.out, "picked.jsonl"), "w") as f:
        f.writelines(json.dumps({"id": "unseen-" + r["id"], "source": r["id"]}) + "\n" for r in picked)
    todo = [r for r in picked if "unseen-" + r["id"] not in done]
    if a.pick_only:
        return
    if todo:
        eng = datagen.make_engine(model, "bfloat16", 32768)
        t0 = time.time()
        res = eng.generate(
            input_ids=[r["prompt_ids"] for r in todo],
            sampling_params={"max_new_tokens": a.max_new_tokens, "temperature": 0},
        )
        eng.shutdown()
        with append_rows(path) as put:
            for r, o in zip(todo, res):
                put({"id": "unseen-" + r["id"], "source": r["id"], "family": r["family"], "split": "heldout",
                     "prompt_ids": r["prompt_ids"], "answer_ids": list(o["output_ids"])})  # fmt: skip
        n = sum(len(o["output_ids"]) for o in res)
        print(f"unseen: {len(todo)} answers, {n} tokens, {n / (time.time() - t0):.1f} tok/s", file=sys.stderr)
    st = features.run(a.out, model)
    print("unseen features:", json.dumps(st), file=sys.stderr)


if __name__ == "__main__":
    main()
