"""Training blocks: many anchors of one sequence in ONE drafter forward, with serving semantics.

Each anchor p gives a block [token_p, MASK x (B-1)] at positions p..p+B-1. Its queries see the
context rows [0, p) of its own sequence and the B rows of its own block, nothing else (a boolean
attention mask), which is what TorchBlockAttention gives one request at serving time.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Sequence

import torch
import torch.nn.functional as F

from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.pipeline.draft import draft_rows
from sglang_dflash.train.dflash2 import selector_drafts


@dataclass
class Seq:
    id: str
    tokens: torch.Tensor  # [T] int64, prompt + answer
    feats: torch.Tensor  # [T, K*H] target features (bf16)
    answer_start: int  # first answer position
    labels: torch.Tensor | None = None  # [T] the target's greedy token after t (None: tokens[t + 1])
    topk_ids: torch.Tensor | None = None  # [T, k] int32 the target's top-k after t (-1: none)
    topk_logp: torch.Tensor | None = None  # [T, k] their log-probabilities


def sample_anchors(seqs: list[Seq], n: int, block: int, g: torch.Generator, spread: bool = False):
    """-> [(seq, anchors [A] int64)]: anchors p in [answer_start, T-2] (at least one target).
    Random distinct anchors, n // len(seqs) per sequence; spread=True: about n evenly spaced overall."""
    out = []
    if spread:
        total = sum(max(s.tokens.shape[0] - 1 - s.answer_start, 0) for s in seqs)
        step = max(total // max(n, 1), 1)
        for s in seqs:
            cand = torch.arange(s.answer_start, s.tokens.shape[0] - 1)
            if cand.numel():
                out.append((s, cand[(s.answer_start % step) :: step] if cand.numel() > step else cand[:1]))
        return out
    per = max(n // max(len(seqs), 1), 1)
    for s in seqs:
        cand = torch.arange(s.answer_start, s.tokens.shape[0] - 1)
        if cand.numel():
            out.append((s, cand[torch.randperm(cand.numel(), generator=g)[:per]].sort().values))
    return out


def block_inputs(seq: Seq, anchors: torch.Tensor, block: int, mask_token_id: int):
    """anchors [A] -> block ids [A, B], positions [A, B], targets [A, B-1] (-100: no label).
    Row j predicts the target's greedy token after position p+j-1; a label counts only while the
    data tokens p+1..p+j-1 equal the target's own greedy chain, so it is the token serving would
    verify after j-1 accepted drafts (always so for the target's answers; text documents stop
    at the first token the target would not have written)."""
    T = seq.tokens.shape[0]
    pos = anchors[:, None] + torch.arange(block)[None, :]  # [A, B]
    ids = torch.full_like(pos, mask_token_id)
    ids[:, 0] = seq.tokens[anchors]
    labels = seq.labels if seq.labels is not None else torch.cat([seq.tokens[1:], torch.tensor([-100])])  # [T]
    on_chain = torch.cat([seq.tokens[1:] == labels[:-1], torch.tensor([False])])  # [T]: t+1 is greedy
    lpos = pos[:, :-1].clamp(max=T - 1)  # [A, B-1] positions p+j-1 whose next token row j predicts
    inside = pos[:, :-1] < T
    chain = torch.cat([torch.ones_like(inside[:, :1]), on_chain[lpos[:, :-1]].cumprod(1).bool()], 1)  # [A, B-1]
    targets = torch.where(inside & chain, labels[lpos], torch.full_like(lpos, -100))
    return ids, pos, targets


def block_soft(batch, block: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """batch [(seq, anchors [A])] -> the target's top-k after each position block row j predicts
    (ids [n, B-1, k], log-probs [n, B-1, k], rows in block_hidden's order), or None when a sequence
    has none stored. Rows block_inputs gives no label are masked by the loss's weights."""
    if any(seq.topk_ids is None for seq, _ in batch):
        return None
    ids, logp = [], []
    for seq, anchors in batch:
        lpos = (anchors[:, None] + torch.arange(block - 1)[None, :]).clamp(max=seq.tokens.shape[0] - 1)
        ids.append(seq.topk_ids[lpos]), logp.append(seq.topk_logp[lpos])
    return torch.cat(ids), torch.cat(logp)


def block_mask(anchors: torch.Tensor, ctx_len: int, block: int) -> torch.Tensor:
    """[A*B, ctx_len + A*B] bool: row (a, j) sees context c < anchors[a] and block rows of anchor a."""
    A = anchors.shape[0]
    row_anchor = torch.arange(A).repeat_interleave(block)  # [A*B]
    ctx = torch.arange(ctx_len)[None, :] < anchors[row_anchor][:, None]
    blk = row_anchor[:, None] == row_anchor[None, :]
    return torch.cat([ctx, blk], dim=1)


def block_hidden(drafter: DFlashDrafter, embed: torch.Tensor, mask_token_id: int, block: int, batch):
    """embed [V, H] the target's embedding; batch [(seq, anchors [A])] ->
    hidden [n, B-1, H] (drafter output at block rows 1..B-1), targets [n, B-1]; n = sum A."""
    ids, pos, tgts, kvs, masks, sizes = [], [], [], [], [], []
    for seq, anchors in batch:
        i, p, t = block_inputs(seq, anchors, block, mask_token_id)
        ctx_len = int(anchors.max())
        k, v = drafter.context_kv(seq.feats[:ctx_len], torch.arange(ctx_len))  # [L, Tc, Hkv, D] each
        ids.append(i), pos.append(p), tgts.append(t), kvs.append((k, v))
        masks.append(block_mask(anchors, ctx_len, block)), sizes.append(i.numel())
    scale = drafter.cfg.head_dim**-0.5

    def attend(layer: int, q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor) -> torch.Tensor:
        """q [N, H, D]; k_blk, v_blk [N, Hkv, D] -> [N, H, D]; N = all block rows of the batch."""
        outs, start = [], 0
        for (kc, vc), mask, n in zip(kvs, masks, sizes):
            r = slice(start, start + n)
            start += n
            k = torch.cat([kc[layer].to(q.dtype), k_blk[r].to(q.dtype)])  # [Tc + n, Hkv, D]
            v = torch.cat([vc[layer].to(q.dtype), v_blk[r].to(q.dtype)])
            o = F.scaled_dot_product_attention(
                q[r].transpose(0, 1)[None],
                k.transpose(0, 1)[None],
                v.transpose(0, 1)[None],
                attn_mask=mask,
                scale=scale,
                enable_gqa=q.shape[1] != k.shape[1],
            )
            outs.append(o[0].transpose(0, 1))
        return torch.cat(outs)

    ids, pos = torch.cat(ids), torch.cat(pos)  # [n, B]
    x = embed[ids.reshape(-1)].to(drafter.fc.weight.dtype)  # [n*B, H]
    hidden = drafter(x, pos.reshape(-1), attend, block).view(ids.shape[0], block, -1)
    return hidden[:, 1:], torch.cat(tgts)


def anchor_ids(batch) -> torch.Tensor:
    """batch [(seq, anchors [A])] -> the anchors' tokens [n] (block column 0), in block_hidden's order."""
    return torch.cat([seq.tokens[anchors] for seq, anchors in batch])


@torch.no_grad()
def eval_tau(
    drafter: DFlashDrafter,
    embed: torch.Tensor,
    mask_token_id: int,
    block: int,
    eval_set,
    chunk: int = 8,
    autocast: bool = True,
    vocab: torch.Tensor | None = None,
) -> float:
    """Offline acceptance length: 1 + leading draft positions whose argmax (full vocab, or over the
    token ids `vocab` [N] of a reduced draft vocabulary) equals the label, averaged over anchors."""
    total, count = 0.0, 0
    for i in range(0, len(eval_set), chunk):
        part = eval_set[i : i + chunk]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            hidden, targets = block_hidden(drafter, embed, mask_token_id, block, part)
        ok = _accepted(hidden, targets, embed, vocab, getattr(drafter, "selector", None), anchor_ids(part))
        total += float(ok.sum()) + ok.shape[0]
        count += ok.shape[0]
    return total / max(count, 1)


def _accepted(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: torch.Tensor,
    vocab: torch.Tensor | None = None,
    selector=None,
    anchors: torch.Tensor | None = None,
) -> torch.Tensor:
    """hidden [n, B-1, H], targets [n, B-1]; head [V, H]; vocab [N] the reduced draft vocabulary's
    token ids (argmax over those rows only); selector (DFlash 2) with anchors [n]: the drafts are
    its greedy walk, as served -> leading draft tokens equal to the targets [n]."""
    n, k, h = hidden.shape
    w = head if vocab is None else head[vocab]
    if selector is not None:
        pred = selector_drafts(selector, hidden, anchors, w, vocab)
    else:
        pred = (hidden.reshape(n * k, h).to(w.dtype) @ w.t()).argmax(-1)  # 2D: no bmm copy
        pred = (pred if vocab is None else vocab[pred]).view(n, k)
    return (pred == targets).to(torch.int64).cumprod(-1).sum(-1)


@torch.no_grad()
def accepted_per_anchor(
    drafter: DFlashDrafter,
    embed: torch.Tensor,
    mask_token_id: int,
    block: int,
    seqs: list[Seq],
    max_answer: int | None = None,
    autocast: bool = True,
    head: torch.Tensor | None = None,
    vocab: torch.Tensor | None = None,
) -> list[tuple[list[int], int, int]]:
    """Per sequence (accepted drafts at every answer anchor, answer start, walk end): the drafter's
    part of a walk, computed once however many width schedules walk it. head [V, H]: an untied LM
    head (default: embed, the tied one); vocab: a reduced draft vocabulary's token ids."""
    out = []
    for s in seqs:
        end = s.tokens.shape[0] if max_answer is None else min(s.tokens.shape[0], s.answer_start + max_answer)
        anchors = torch.arange(s.answer_start, end - 1)
        if not anchors.numel():
            out.append(([], s.answer_start, end))
            continue
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            hidden, targets = block_hidden(drafter, embed, mask_token_id, block, [(s, anchors)])
        sel = getattr(drafter, "selector", None)
        ok = _accepted(hidden, targets, embed if head is None else head, vocab, sel, s.tokens[anchors])
        out.append((ok.tolist(), s.answer_start, end))
    return out


def walk(acc, start: int, end: int, widths: Sequence[int] | None = None) -> tuple[int, int]:
    """Walk one answer as greedy speculative decoding would (a block at the answer start, the next
    one after the accepted tokens + bonus) -> (committed tokens, blocks); (0, 0) with no anchor.
    acc: accepted drafts per anchor, or {W: those of the rows a width-W step drafts} (walk_counts);
    widths: verify widths cycled per step (serving's debug width cycle; default: the block)."""
    p, tokens, blocks_n = start, 0, 0
    while acc and p < end - 1:
        w = widths[blocks_n % len(widths)] if widths else None
        a = (acc[w] if isinstance(acc, dict) else acc)[p - start]
        if widths:  # only the step's first W rows are verified
            a = min(a, w - 1)
        tokens += min(a + 1, end - p)
        blocks_n += 1
        p += a + 1
    return tokens, blocks_n


def walk_counts(drafter, embed, mask_token_id, block, seqs, *args, widths=None, **kw) -> list[tuple[int, int]]:
    """walk() over every sequence -> [(committed tokens, blocks)]; the other arguments are
    accepted_per_anchor's. With widths, each step's drafts are those of the rows serving drafts at
    its width (pipeline/draft.draft_rows), so the walk stays serving-equivalent."""
    if not widths:
        runs = accepted_per_anchor(drafter, embed, mask_token_id, block, seqs, *args, **kw)
        return [walk(acc, start, end) for acc, start, end in runs]
    rows = {w: draft_rows(w, block, getattr(drafter, "selector", None)) for w in set(widths)}
    per = {r: accepted_per_anchor(drafter, embed, mask_token_id, r, seqs, *args, **kw) for r in set(rows.values())}
    out = []
    for i in range(len(seqs)):
        first, start, end = per[rows[widths[0]]][i]
        out.append(walk({w: per[r][i][0] for w, r in rows.items()} if first else [], start, end, widths))
    return out


def walk_tau(
    drafter: DFlashDrafter,
    embed: torch.Tensor,
    mask_token_id: int,
    block: int,
    seqs: list[Seq],
    max_answer: int | None = None,
    autocast: bool = True,
    vocab: torch.Tensor | None = None,
) -> float:
    """Serving-equivalent tau: tokens / blocks over walk_counts. Lower than eval_tau, which weights
    every position equally and so over-counts easy stretches."""
    counts = walk_counts(drafter, embed, mask_token_id, block, seqs, max_answer, autocast, vocab=vocab)
    return sum(t for t, _ in counts) / max(sum(b for _, b in counts), 1)
