"""Choose the reduced draft vocabulary by measurement: the same trained weights, their argmax taken
over the N most frequent training labels instead of all V tokens, held-out walk tau for each N.

The cut only shrinks the draft head's matmul (verify stays full-vocabulary, output unchanged); what it
can cost is acceptance, when the target's next token is outside the N. The smallest N whose walk tau
is within `tolerance` of the full head's and whose N tokens cover at least `min_coverage` of the
training labels is kept (the coverage floor guards prompts unlike the held-out split, where a
token outside the N can never be drafted).
"""

from __future__ import annotations

import torch

from sglang_dflash.model.draft_vocab import coverage, most_frequent
from sglang_dflash.train.blocks import walk_tau

CANDIDATES = (32768, 16384, 8192, 4096)


def label_counts(train, vocab_size: int) -> torch.Tensor:
    """[V] how often each token is a training label (the target's greedy next token)."""
    from sglang_dflash.train.trainer import _labels

    return torch.bincount(torch.cat([_labels(s) for s in train]), minlength=vocab_size)


def choose(
    drafter, embed, mask: int, block: int, held, counts, candidates=CANDIDATES, tolerance=0.01, min_coverage=0.99
):
    """-> (N or 0 for the full head, ids [N] or None, rows [{"draft_vocab", "coverage", "walk_tau_128"}])."""
    full = walk_tau(drafter, embed, mask, block, held, max_answer=128)
    rows = [{"draft_vocab": embed.shape[0], "coverage": 1.0, "walk_tau_128": round(full, 4)}]
    best = (0, None)
    for n in sorted(c for c in candidates if c < embed.shape[0]):
        ids = most_frequent(counts, n)
        tau = walk_tau(drafter, embed, mask, block, held, max_answer=128, vocab=ids)
        cover = coverage(counts, ids)
        rows.append({"draft_vocab": n, "coverage": round(cover, 5), "walk_tau_128": round(tau, 4)})
        if best[0] == 0 and tau >= full * (1 - tolerance) and cover >= min_coverage:
            best = (n, ids)
    return best[0], best[1], rows


def decide(drafter, embed, mask: int, block: int, train, held, draft_vocab: int):
    """draft_vocab -1: the measured choice over CANDIDATES; N > 0: the N most frequent labels (its tau
    measured too) -> (N or 0 for the full head, ids [N] or None, measured rows)."""
    counts = label_counts(train, embed.shape[0])
    cands = CANDIDATES if draft_vocab < 0 else (draft_vocab,)
    n, ids, rows = choose(drafter, embed, mask, block, held, counts, cands)
    if draft_vocab > 0:
        n, ids = draft_vocab, most_frequent(counts, draft_vocab)
    return n, ids, rows


def cut_checkpoint(drafter_dir: str, workdir: str, model: str, out: str, draft_vocab: int = -1) -> dict:
    """An exported drafter folder -> the same weights with the measured (or given) reduced draft
    vocabulary in `out` (config draft_vocab_size + d2t); the card gets the measured table appended.
    Label counts come from `workdir`'s training labels, walk tau from its held-out answers."""
    import json
    import os
    import shutil

    from safetensors.torch import load_file

    from sglang_dflash.model.draft_vocab import d2t_from_ids
    from sglang_dflash.model.checkpoint import load_exported, write_checkpoint
    from sglang_dflash.train.features import load_seqs
    from sglang_dflash.train.target_files import load_embedding

    drafter, cfg, mask = load_exported(drafter_dir, model)
    train, held = load_seqs(workdir)
    embed = load_embedding(model)
    n, ids, rows = decide(drafter, embed, mask, cfg.block_size, train, held, draft_vocab)
    del train
    with open(os.path.join(drafter_dir, "config.json")) as f:
        config = json.load(f)
    state = load_file(os.path.join(drafter_dir, "model.safetensors"))
    card = open(os.path.join(drafter_dir, "README.md")).read()
    if n:
        config["draft_vocab_size"], state["d2t"] = n, d2t_from_ids(ids)
    write_checkpoint(out, config, state)
    for extra in ("learning_curve.png",):
        if os.path.exists(os.path.join(drafter_dir, extra)) and drafter_dir != out:
            shutil.copy(os.path.join(drafter_dir, extra), out)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(card.rstrip("\n") + f"\n\n## Draft vocabulary (cut after training)\n{cut_text(rows, n or None)}\n")
    res = {"draft_vocab": n, "rows": rows, "heldout": len(held)}
    print("vocab_cut:", json.dumps(res))
    return res


def cut_text(rows: list[dict], n_vocab: int | None) -> str:
    if not rows:
        return f"{n_vocab or 'all'} tokens (not measured against other sizes in this run)."
    parts = [f"{r['draft_vocab']} tokens: {r['walk_tau_128']:.3f} (label coverage {r['coverage']:.4f})" for r in rows]
    kept = f"{n_vocab} kept" if n_vocab else "the full head kept"
    return (
        "the trained weights' held-out walk tau (first 128 tokens) with the argmax over the N most "
        f"frequent training labels, {'; '.join(parts)}; the smallest N within 1% of the full head and "
        f"covering >= 99% of the labels: {kept}."
    )
