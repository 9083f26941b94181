"""The sampled walk: the tokens a sampled request commits per verify step, in expectation, computed
from the target's p and the drafter's q at every block position (no sampling noise).

What the server does (pipeline/draft.py sample_drafts, pipeline/target_sampling.py), per rule:
- argmax: every draft is the argmax of the drafter's logits, verified by sample-and-match:
  slot i is accepted with probability p_i(argmax q_i).
- q1: draft 1 is drawn from q_1 = softmax(top-32 drafter logits / T) (renormalized over those 32),
  verified by rejection (keep x with min(1, p/q), else the residual): accepted with probability
  sum_x min(p_1(x), q_1(x)); drafts 2.. are argmax point masses (sample-and-match).
- qall: every draft drawn from its own q_i independently, each verified by rejection.
DFlash 2 (a drafter with a selector; path_walk.py) has its own two rules:
- argmax: the greedy path (point masses, what a seeded request drafts), sample-and-match.
- path: the path drawn slot by slot from q_j(. | a) = softmax(S_j(a, .) / T) after the candidate a
  drawn before it, every slot verified by rejection (what an unseeded sampled request drafts).
p = softmax(target logits / T) over the full vocabulary (no top-k / top-p). T = 0: every rule drafts
the argmax and p is the target's argmax, so the sampled walk is the greedy walk.

The approximation, stated exactly. alpha_i below is the acceptance probability of slot i given that
slots 1..i-1 were accepted, with p_i the target's distribution after the TEACHER-FORCED prefix (the
data's tokens through the block's row i-1: the target's own greedy answer), not after the drafted
tokens that were accepted before i. Exact for slot 1 (its prefix is the committed one) and for every
slot whose earlier accepted drafts equal the data's tokens; otherwise p_i(. | x_<i) is replaced by
p_i(. | data_<i). The contexts walked are the target's greedy answers, not answers sampled at T.
Given the alphas, the rest is exact: P(at least k accepted) = prod_{i<=k} alpha_i, and the walk's
anchors form a Markov chain (the next anchor is the current one + accepted + 1), so the expected
tokens and verify steps over an answer follow by dynamic programming over its positions; tau is
sum(E tokens) / sum(E steps) over the set, as blocks.walk_tau aggregates the greedy walk.
"""

from __future__ import annotations

import torch

from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.path_walk import greedy_path
from sglang_dflash.pipeline.draft import DRAFT_TOP_K
from sglang_dflash.train.blocks import Seq, block_hidden
from sglang_dflash.train.dflash2 import selector_candidates

RULES = ("argmax", "q1", "qall")
PATH_RULES = ("argmax", "path")  # DFlash 2


def slot_accept(p_cand: torch.Tensor, q_logits: torch.Tensor, temperature: float, rule: str) -> torch.Tensor:
    """p_cand [A, K, C]: the target's probabilities at the drafter's top-C tokens of each slot (at
    temperature T; at T = 0 a one-hot of the target's argmax), candidates in descending drafter
    logit, so column 0 is the argmax draft; q_logits [A, K, C]: their drafter logits ->
    alpha [A, K]: slot i's acceptance probability given slots < i accepted (module docstring)."""
    if rule not in RULES:
        raise ValueError(f"rule {rule!r}: use one of {RULES}")
    point = p_cand[..., 0]  # sample-and-match of the argmax draft
    if rule == "argmax" or temperature <= 0:
        return point
    q = torch.softmax(q_logits.double() / temperature, dim=-1)
    overlap = torch.minimum(p_cand.double(), q).sum(-1)  # rejection: sum_x min(p(x), q(x))
    if rule == "qall":
        return overlap
    out = point.double().clone()
    out[:, 0] = overlap[:, 0]
    return out


def path_accept(p_cand: torch.Tensor, edges: torch.Tensor, temperature: float) -> torch.Tensor:
    """p_cand [A, P, K]: the target's probabilities (at T > 0) at each slot's selector candidates;
    edges [A, P, K, K]: selector.edges -> alpha [A, P]: slot j's acceptance probability given slots
    < j accepted, for the path drawn from q_j(. | a) = softmax(S_j(a, .) / T) and verified by
    rejection. What slot j draws after depends on the candidate accepted before it, whose law given
    acceptance is min(p, q) / alpha mixed over that slot's own predecessor: carried slot to slot."""
    n, p, k, _ = edges.shape
    before = torch.zeros(n, k, dtype=torch.float64)
    before[:, 0] = 1.0  # slot 0: every predecessor row is the anchor (selector.edges)
    alpha = torch.zeros(n, p, dtype=torch.float64)
    for j in range(p):
        q = torch.softmax(edges[:, j].double() / temperature, dim=-1)  # [A, K_prev, K]
        kept = (before[:, :, None] * torch.minimum(p_cand[:, j, None, :].double(), q)).sum(1)  # [A, K]
        alpha[:, j] = kept.sum(-1)
        before = kept / alpha[:, j, None].clamp_min(1e-300)
    return alpha


def expected_walk(alpha: torch.Tensor, start: int, end: int, width: int | None = None) -> tuple[float, float]:
    """alpha [A, K]: row a - start for anchor a in [start, end - 1) (A = end - 1 - start), column i
    slot i+1's acceptance given the earlier ones -> (E committed tokens, E verify steps) of
    blocks.walk(start, end) over the random accepted lengths; width W verifies slots < W only.
    With alphas in {0, 1} this is blocks.walk exactly."""
    n = end - 1 - start
    if n <= 0 or alpha.shape[0] == 0:
        return 0.0, 0.0
    k = alpha.shape[1] if width is None else min(width - 1, alpha.shape[1])
    surv = alpha[:, :k].double().cumprod(1)  # [A, k]: P(at least i+1 accepted)
    s = torch.cat([torch.ones(n, 1, dtype=surv.dtype), surv, torch.zeros(n, 1, dtype=surv.dtype)], 1)
    pk = (s[:, :-1] - s[:, 1:]).tolist()  # [A][k+1]: P(exactly j accepted)
    e_tok, e_blk = [0.0] * (n + k + 1), [0.0] * (n + k + 1)  # past the last anchor: the walk stops
    for i in range(n - 1, -1, -1):
        left = end - (start + i)  # a step commits at most what is left of the answer
        tok = blk = 0.0
        for j, pj in enumerate(pk[i]):
            if pj:
                tok += pj * (min(j + 1, left) + e_tok[i + j + 1])
                blk += pj * e_blk[i + j + 1]
        e_tok[i], e_blk[i] = tok, 1.0 + blk
    return e_tok[0], e_blk[0]


@torch.inference_mode()
def target_logits(target, tokens: torch.Tensor, first: int, last: int) -> torch.Tensor:
    """tokens [T] -> the HF target's float logits [last - first, V] after positions first..last-1
    (teacher-forced over tokens[:last])."""
    h = target.model(input_ids=tokens[None, :last]).last_hidden_state[0, first:]
    return target.lm_head(h).float()


def candidate_probs(logits: torch.Tensor, rows: torch.Tensor, cand: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits [R, V] target logits; rows [A, K] the row each slot reads; cand [A, K, C] token ids ->
    p [A, K, C]: softmax(logits / T) at the candidates, gathered flat (no [A, K, V] copy)."""
    logp = torch.log_softmax(logits / temperature, dim=-1)
    flat = rows[..., None] * logits.shape[1] + cand
    return logp.reshape(-1)[flat].exp()


def first_max_topk(logits: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, V] -> the top c (values, indices) [N, c], equal values in ascending index, so
    column 0 is argmax()'s first maximum: the argmax draft the server makes (bf16 logits tie often)."""
    vals, idx = logits.topk(c, dim=-1)
    order = idx.argsort(-1)
    vals, idx = vals.gather(-1, order), idx.gather(-1, order)
    vals, order = vals.sort(dim=-1, descending=True, stable=True)
    return vals, idx.gather(-1, order)


@torch.no_grad()
def sampled_walk_counts(
    drafter: DFlashDrafter,
    embed: torch.Tensor,
    mask_token_id: int,
    block: int,
    seqs: list[Seq],
    target,
    temperatures=(0.0, 0.7, 1.0),
    widths=(None,),
    max_answer: int | None = None,
    vocab: torch.Tensor | None = None,
    autocast: bool = True,
) -> dict[tuple[float, str, int | None], tuple[float, float]]:
    """-> {(T, rule, width): (sum E tokens, sum E steps)} over seqs (T = 0: rule "argmax" only).
    embed [V, H]: the target's embedding and tied LM head; vocab [N]: a reduced draft vocabulary's
    token ids; target: the HF target (features.load_target) whose p the walk verifies against.
    A DFlash 2 drafter walks PATH_RULES, a DFlash 1 drafter RULES."""
    sel = getattr(drafter, "selector", None)
    out: dict = {}
    w = embed if vocab is None else embed[vocab]
    for s in seqs:
        size = s.tokens.shape[0]
        end = size if max_answer is None else min(size, s.answer_start + max_answer)
        anchors = torch.arange(s.answer_start, end - 1)
        if not anchors.numel():
            continue
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            hidden, labels = block_hidden(drafter, embed, mask_token_id, block, [(s, anchors)])  # [A, K, H], [A, K]
        a, k, h = hidden.shape
        if sel is None:
            logits = (hidden.reshape(a * k, h).to(w.dtype) @ w.t()).float()  # [A*K, N]
            vals, idx = first_max_topk(logits, min(DRAFT_TOP_K, logits.shape[1]))
            vals, idx = vals.view(a, k, -1), idx.view(a, k, -1)
            cand = idx if vocab is None else vocab[idx]  # target ids [A, K, C]
        else:
            vals, cand = selector_candidates(sel, hidden, w, vocab)  # [A, K, C]: C = the selector's K
            edges = sel.edges(s.tokens[anchors], cand, vals, hidden)  # [A, K, C, C]
            greedy = greedy_path(edges, sel.walk)[..., None]  # [A, K, 1]
        valid = labels != -100  # the rows the greedy walk labels: inside the sequence, on the chain
        rows = (anchors[:, None] + torch.arange(k)[None, :]).clamp(max=size - 1) - s.answer_start  # [A, K]
        tl = None
        for t in temperatures:
            if t <= 0:
                p, rules = (cand == labels[..., None]).double(), ("argmax",)
            else:
                if tl is None:
                    tl = target_logits(target, s.tokens, s.answer_start, min(size, end + k - 1))
                p = candidate_probs(tl, rows.clamp(max=tl.shape[0] - 1), cand, t)
                rules = RULES if sel is None else PATH_RULES
            for rule in rules:
                if sel is None:
                    alpha = slot_accept(p, vals, t, rule)
                else:
                    alpha = p.gather(2, greedy).squeeze(2) if rule == "argmax" else path_accept(p, edges, t)
                alpha = torch.where(valid, alpha.double(), 0.0)
                for wd in widths:
                    tok, steps = expected_walk(alpha, s.answer_start, end, wd)
                    prev = out.get((t, rule, wd), (0.0, 0.0))
                    out[(t, rule, wd)] = (prev[0] + tok, prev[1] + steps)
    return out


def taus(counts: dict) -> dict[str, dict[str, dict[str, float]]]:
    """sampled_walk_counts -> {"T0.7": {rule: {"W": tau}}} (width None: the whole block, "all")."""
    out: dict = {}
    for (t, rule, wd), (tok, steps) in counts.items():
        out.setdefault(f"T{t:g}", {}).setdefault(rule, {})[str(wd or "all")] = round(tok / max(steps, 1e-9), 4)
    return out
