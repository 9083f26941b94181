"""Datagen prompts with long contexts: a whole source file or document installed on this machine
(the corpus's own sources: stdlib and site-packages Python, /usr/share/doc texts; never the unseen
set's C headers, JavaScript or pydoc topics) followed by a question about it. The target answers
them itself, so the drafter trains on answers with several hundred to a few thousand tokens of
prompt before them, as served requests have (`train datagen --prompts long`)."""

from __future__ import annotations

import hashlib
import itertools
import random

from sglang_dflash.train import corpus

LONG_PREFIX = "long-"
CODE_QUESTIONS = (
    "Explain what the code above does, function by function.",
    "Summarize the purpose of this module in a short paragraph, then list its main functions.",
    "Write a short usage example for the most important function above.",
    "Point out one possible bug or edge case in the code above and suggest a fix.",
    "Write docstrings for the functions above that have none.",
)
TEXT_QUESTIONS = (
    "Summarize the text above in a few sentences.",
    "What are the three most important points of this document?",
    "Explain the document above to someone new to the topic.",
    "Write a short FAQ (three questions and answers) based on the text above.",
)


def _cut(text: str, min_chars: int, max_chars: int) -> str | None:
    """The text's opening up to max_chars, cut at a line end; None when shorter than min_chars."""
    if len(text) > max_chars:
        text = text[: text.rfind("\n", 0, max_chars) + 1 or max_chars]
    text = text.strip()
    return text if len(text) >= min_chars else None


def long_prompts(seed: int = 0, min_chars: int = 1500, max_chars: int = 4500) -> list[dict]:
    """{"id": "long-<hash>", "family": "long-code" | "long-prose", "split": "train", "messages": [user]},
    the two families taken in turn (each shuffled by seed); a question picked per text by its hash."""
    fams: dict[str, list[dict]] = {"code": [], "prose": []}
    files = [f for f in corpus._stdlib_files() + corpus._lib_files() if "pydoc_data" not in f]
    texts = [("code", open(f, encoding="utf-8", errors="replace").read()) for f in files]
    texts += [("prose", t) for t in corpus._doc_texts()]
    seen = set()
    for fam, raw in texts:
        text = _cut(raw, min_chars, max_chars)
        if text is None or corpus._BENCH_NAMES.search(text):
            continue
        h = hashlib.sha1(text.encode()).hexdigest()[:16]
        if h in seen:
            continue
        seen.add(h)
        qs = CODE_QUESTIONS if fam == "code" else TEXT_QUESTIONS
        q = qs[int(h, 16) % len(qs)]
        body = f"```python\n{text}\n```" if fam == "code" else text
        msg = {"role": "user", "content": f"{body}\n\n{q}"}
        fams[fam].append({"id": LONG_PREFIX + h, "family": f"long-{fam}", "split": "train", "messages": [msg]})
    for fam in sorted(fams):
        random.Random(f"long-{seed}-{fam}").shuffle(fams[fam])
    turns = itertools.zip_longest(*(fams[f] for f in sorted(fams)))
    return [p for turn in turns for p in turn if p is not None]
