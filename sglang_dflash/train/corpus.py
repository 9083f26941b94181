"""Chat documents built from text installed on this machine, labelled by the target in ONE prefill.

Sources (no public benchmark set, nothing downloaded):
- code: functions of the Python standard library with a docstring; the user asks to implement the
  signature + docstring, the assistant turn is the real source.
- library code: the same, from the installed site-packages (LIB_FILES_PER_PACKAGE files of each
  top-level package, so no one library dominates; tests, benchmarks, examples and evals skipped, as
  is any file naming a public benchmark set).
- prose: Python module docstrings and the README / markdown files under /usr/share/doc; the user
  asks to continue the opening lines, the assistant turn is what follows.
The assistant turn is real text, not the target's answer, so features.py labels every position
with the target's argmax there (one prefill per document instead of one decode per token), and
blocks.py keeps a block position's label only while the text up to it equals the target's own
argmax chain (then the label is exactly the target's greedy continuation).
Every document is in the train split: the held-out split stays the generated prompts' answers.
ask_prompts() gives datagen the same documents' user turns as prompts (--prompts corpus): the
target answers them itself, so every label is a whole greedy chain, on prompts unlike the templates.
"""

from __future__ import annotations

import ast
import functools
import glob
import gzip
import hashlib
import itertools
import os
import random
import re
import sysconfig

DOC_ROOT = "/usr/share/doc"
ID_PREFIX = "text-"  # a corpus document's id (datagen answers are "p<N>")
LIB_FILES_PER_PACKAGE = 24
_LIB_SKIP = {"test", "tests", "testing", "_pytest", "pytest", "sglang", "sglang_dflash", "benchmark", "benchmarks"}
_LIB_SKIP |= {"example", "examples", "eval", "evals", "evaluation", "datasets", "__pycache__"}
_BENCH_NAMES = re.compile(r"humaneval|gsm8k|mbpp|mt.?bench", re.I)  # never train near a public benchmark


def _stdlib_files() -> list[str]:
    lib = sysconfig.get_paths()["stdlib"]
    files = glob.glob(os.path.join(lib, "*.py")) + glob.glob(os.path.join(lib, "*", "*.py"))
    skip = ("test", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo")
    return sorted(f for f in files if not any(f"/{s}" in f[len(lib) :] for s in skip))


def _lib_files(per_package: int = LIB_FILES_PER_PACKAGE) -> list[str]:
    """per_package .py files of each installed top-level package, picked by a hash of the path
    relative to site-packages (the same pick on every machine with the same packages)."""
    root = sysconfig.get_paths()["purelib"]
    per: dict[str, list[str]] = {}
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = sorted(x for x in dirs if x not in _LIB_SKIP and not x.endswith(".dist-info"))
        if rel == ".":
            continue
        for f in files:
            if f.endswith(".py") and not f.startswith("test"):
                per.setdefault(rel.split(os.sep)[0], []).append(os.path.relpath(os.path.join(d, f), root))
    out = []
    for _, rels in sorted(per.items()):
        rels.sort(key=lambda r: hashlib.sha1(r.encode()).hexdigest())
        out += [os.path.join(root, r) for r in rels[:per_package]]
    return out


@functools.cache
def _lib_docs() -> tuple[tuple[str, str], ...]:
    return tuple(code_docs(_lib_files()))  # ~15 s of parsing: once per process


@functools.cache
def _base_docs() -> tuple[tuple[str, str, str], ...]:
    """(family, user, assistant) of the stdlib code and prose documents: parsed once per process."""
    return tuple([("code", u, a) for u, a in code_docs()] + [("prose", u, a) for u, a in prose_docs()])


def code_docs(files: list[str] | None = None) -> list[tuple[str, str]]:
    """(user, assistant): implement a function (of the stdlib, or of `files`) from its signature and
    docstring."""
    out = []
    for path in _stdlib_files() if files is None else files:
        try:
            src = open(path, encoding="utf-8").read()
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        if _BENCH_NAMES.search(src):
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            n = node.end_lineno - node.lineno + 1
            if not doc or not 4 <= n <= 60 or len(doc) < 20:
                continue
            body = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            indent = len(body) - len(body.lstrip())
            body = "\n".join(line[indent:] for line in body.splitlines())
            sig = body.split(":\n", 1)[0] + ":"
            first = doc.strip().split("\n\n")[0]
            user = f'Implement this Python function:\n```python\n{sig}\n    """{first}"""\n```'
            out.append((user, f"```python\n{body}\n```"))
    return out


def _doc_texts() -> list[str]:
    texts = []
    pats = ("README*", "*.md", "*.md.gz", "*.txt")
    paths = sorted({p for pat in pats for p in glob.glob(os.path.join(DOC_ROOT, "*", pat))})
    for p in paths:
        try:
            raw = gzip.open(p).read() if p.endswith(".gz") else open(p, "rb").read()
            texts.append(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError, EOFError):
            continue
    for path in _stdlib_files():
        try:
            doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read()))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        if doc:
            texts.append(doc)
    return texts


def prose_docs(chunk_chars: int = 1400) -> list[tuple[str, str]]:
    """(user, assistant): continue a text from its opening lines; long texts give several chunks."""
    out = []
    for text in _doc_texts():
        paras = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 40]
        i = 0
        while i + 1 < len(paras):
            head, body = paras[i], []
            i += 1
            while i < len(paras) and sum(map(len, body)) < chunk_chars:
                body.append(paras[i])
                i += 1
            if sum(map(len, body)) >= 200:
                out.append((f"Continue this text:\n\n{head[:600]}", "\n\n".join(body)))
    return out


def documents(seed: int = 0, lib: bool = True) -> list[dict]:
    """Every document, in a fixed shuffled order: {"id", "family", "messages"}. The library code
    comes after the stdlib and prose documents (shuffled apart), so the first N documents of a
    seed stay what they were before it was added (bench/unseen_set.py's --seen-prefix)."""
    groups = [_base_docs(), [("libcode", u, a) for u, a in _lib_docs()] if lib else []]
    seen, out = set(), []
    for group in groups:
        mine = []
        for fam, user, ans in group:
            h = hashlib.sha1((user + ans).encode()).hexdigest()[:16]
            if h in seen:  # the same README ships in several packages
                continue
            seen.add(h)
            msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": ans}]
            mine.append({"id": f"{ID_PREFIX}{h}", "family": f"text-{fam}", "split": "train", "messages": msgs})
        random.Random(seed).shuffle(mine)
        out += mine
    return out


def write(workdir: str, model: str, max_answer_tokens: int = 320, seed: int = 0, exclude=frozenset()) -> dict:
    """W/text.jsonl: the documents tokenized like datagen's rows ({"id", "family", "split",
    "prompt_ids", "answer_ids", "labels": "argmax"}), the answer cut at max_answer_tokens. Documents
    whose id is in `exclude` (a held-out set's sources) never enter it."""
    import json

    from transformers import AutoTokenizer

    from sglang_dflash.resumable_jsonl import append_rows, done_ids

    path = os.path.join(workdir, "text.jsonl")
    done = done_ids(path)
    tok = AutoTokenizer.from_pretrained(model)
    stats = {"documents": 0, "answer_tokens": 0, "excluded": 0}
    with append_rows(path) as put:
        for d in documents(seed):
            if d["id"] in exclude:
                stats["excluded"] += 1
            if d["id"] in done or d["id"] in exclude:
                continue
            ids = tok.apply_chat_template(d["messages"][:1], tokenize=True, add_generation_prompt=True)
            ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
            ans = tok(d["messages"][1]["content"], add_special_tokens=False)["input_ids"][:max_answer_tokens]
            put(
                {
                    **{k: d[k] for k in ("id", "family", "split")},
                    "prompt_ids": ids,
                    "answer_ids": ans,
                    "labels": "argmax",
                }
            )
            stats["documents"] += 1
            stats["answer_tokens"] += len(ans)
    print("corpus:", json.dumps(stats))
    return stats


ASK_PREFIX = "ask-"  # a datagen prompt taken from a corpus document's user turn


def ask_prompts(seed: int = 0, exclude=frozenset()) -> list[dict]:
    """Datagen prompts from the corpus documents' user turns, the families taken in turn (each
    shuffled by seed; so the first n are balanced, not mostly library code): {"id": "ask-<document hash>", "family": "ask-<family>", "split": "train",
    "messages": [user]}. A document whose id is in `exclude` (a held-out set's sources) is left
    out (and any other document asking the same), and a user turn met twice is asked once."""
    docs = documents(seed)
    seen = {d["messages"][0]["content"] for d in docs if d["id"] in exclude}  # not even via a twin
    fams: dict[str, list[dict]] = {}
    for d in docs:
        user = d["messages"][0]["content"]
        if user in seen:
            continue
        seen.add(user)
        fam = d["family"].removeprefix("text-")
        fams.setdefault(fam, []).append({"id": ASK_PREFIX + d["id"].removeprefix(ID_PREFIX), "family": f"ask-{fam}",
                                         "split": "train", "messages": d["messages"][:1]})  # fmt: skip
    for fam in sorted(fams):
        random.Random(f"ask-{seed}-{fam}").shuffle(fams[fam])
    turns = itertools.zip_longest(*(fams[f] for f in sorted(fams)))
    return [p for turn in turns for p in turn if p is not None]
