"""DFlash 2 training: a DFlash 1 drafter upgraded in place, then its convolutions and selector trained.

`upgrade` writes a DFlash 2 drafter whose drafts equal the parent's exactly, so training starts
from the parent's acceptance (the CPU-minutes spent on it are kept, as grow.py does for depth):
  - every sublayer's dynamic convolution is the identity (base tap 0 = 1, tap 1 = 0, the
    coefficient projection zero), so the backbone's forward is the parent's;
  - the selector's predecessor codebook is zero, so every pair score is zero and the greedy walk
    (the chain, see below) is the argmax at every slot, the parent's draft. The successor codebook and the hidden projection
    start small and random: a bilinear term with both sides zero would never get a gradient.

`selector_loss` trains the selector as serving uses it along an accepted prefix: slot j's
predecessor is the target's own token j-1 (the anchor for slot 0), the candidates are the top-k of
the drafter's logits, and the loss is the cross-entropy of softmax_c S_j(prev, c) to the label
when the label is among the candidates. That softmax is exactly the q a sampled path draws slot j
from (path_walk.sample_path at temperature 1), and its argmax the best next slot of a greedy
draft whose prefix was right: the upgraded drafter's config says selector_walk "chain", so serving
walks greedy drafts that way (Viterbi over scores trained slot by slot picks off-path sequences). The backbone's hidden states are detached: the selector learns on
top of the drafter and never changes what the hard loss trains.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from sglang_dflash.model.config import DFLASH2_FIELDS, DrafterConfigError
from sglang_dflash.model.loader import read_state_dict
from sglang_dflash.model.path_walk import greedy_path


def upgrade(
    parent: str, out: str, kernel: int = 2, group: int = 16, rank: int = 32, top_k: int = 8, seed: int = 0
) -> dict:
    """Write the DFlash 2 drafter grown from the DFlash 1 drafter at `parent` to `out`; returns its config."""
    with open(os.path.join(parent, "config.json")) as f:
        cfg = json.load(f)
    d = cfg.setdefault("dflash_config", {})
    if any(k in d or k in cfg for k in DFLASH2_FIELDS):
        raise DrafterConfigError(f"dflash2 upgrade: {parent!r} is already a DFlash 2 drafter")
    hidden, vocab, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    if hidden % group:
        raise DrafterConfigError(f"dflash2 upgrade: --conv-group-size {group} must divide hidden_size {hidden}")
    d.update(conv_kernel_size=kernel, conv_group_size=group, selector_rank=rank, selector_top_k=top_k)
    d["selector_walk"] = "chain"  # what selector_loss trains (path_walk.py)
    state = read_state_dict(parent)
    g = torch.Generator().manual_seed(seed)
    base = torch.zeros(2, kernel, hidden)
    base[:, 0] = 1.0
    for i in range(layers):
        for conv in ("attention_conv", "mlp_conv"):
            state[f"layers.{i}.{conv}.base_kernel"] = base.clone()
            state[f"layers.{i}.{conv}.kernel_projection.weight"] = torch.zeros(2 * kernel * hidden // group, hidden)
    state["candidate_selector.hidden_projection.weight"] = torch.randn(rank, hidden, generator=g) * 0.02
    state["candidate_selector.predecessor_codebook"] = torch.zeros(vocab, rank)
    state["candidate_selector.successor_codebook"] = torch.randn(vocab, rank, generator=g) * 0.1
    os.makedirs(out, exist_ok=True)
    dtype = state["fc.weight"].dtype
    state = {k: (v if k in ("d2t", "t2d") else v.to(dtype)).contiguous() for k, v in state.items()}
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return cfg


SELECTOR_LR_MULT = 10.0  # the selector starts from nothing beside a warm backbone: its own, higher rate


def param_groups(drafter) -> list[dict]:
    """The optimizer's groups: the backbone at the run's rate, the selector (if any) at SELECTOR_LR_MULT x
    (the trainer multiplies each group's lr_mult in)."""
    named = list(drafter.named_parameters())
    sel = [p for n, p in named if n.startswith("candidate_selector.")]
    rest = [p for n, p in named if not n.startswith("candidate_selector.")]
    return [{"params": rest, "lr_mult": 1.0}] + ([{"params": sel, "lr_mult": SELECTOR_LR_MULT}] if sel else [])


def dflash2_fields(drafter_dir: str) -> dict:
    """The DFlash 2 entries of an exported drafter's dflash_config ({} for DFlash 1): a warm start
    from it builds the same kind of drafter."""
    with open(os.path.join(drafter_dir, "config.json")) as f:
        cfg = json.load(f)
    d = cfg.get("dflash_config") or {}
    keys = DFLASH2_FIELDS + ("output_multiplier", "final_logit_softcapping", "selector_walk")
    return {k: d.get(k, cfg.get(k)) for k in keys if d.get(k, cfg.get(k)) is not None}


def selector_candidates(selector, hidden: torch.Tensor, head: torch.Tensor, vocab: torch.Tensor | None):
    """hidden [n, P, H]; head [N, H] the rows the drafter scores, vocab [N] their token ids (None:
    the row index is the id) -> values, candidate token ids [n, P, K]."""
    n, p, h = hidden.shape
    logits = (hidden.detach().reshape(n * p, h).to(head.dtype) @ head.t()).view(n, p, -1)
    values, cand = selector.candidates(logits)
    return values, (cand if vocab is None else vocab[cand])


def scores_after(selector, values, cand, prev, hidden) -> torch.Tensor:
    """values, cand [n, P, K]; prev [n, P] the token before each slot; hidden [n, P, H] ->
    S_j(prev_j, c) [n, P, K]: the row of selector.edges whose predecessor is prev_j."""
    a = selector.predecessor_codebook[prev].float()  # [n, P, r]
    g = selector.hidden_projection(hidden.to(selector.hidden_projection.weight.dtype)).float()  # [n, P, r]
    b = selector.successor_codebook[cand].float()  # [n, P, K, r]
    return values.float() + torch.einsum("npr,npkr->npk", a * g, b)


def selector_loss(
    selector,
    hidden: torch.Tensor,
    anchor_ids: torch.Tensor,
    targets: torch.Tensor,
    head: torch.Tensor,
    vocab: torch.Tensor | None,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, float]:
    """hidden [n, P, H] drafter output at the proposal slots; anchor_ids [n]; targets [n, P] token
    ids (-100: no label; a chain, so a label's predecessor always has one); head/vocab as in
    selector_candidates; weights [P] per slot -> (weighted cross-entropy over the candidates, the share of
    labelled slots whose label is a candidate)."""
    with torch.no_grad():
        values, cand = selector_candidates(selector, hidden, head, vocab)  # [n, P, K]
    prev = torch.cat([anchor_ids[:, None], targets[:, :-1]], dim=1).clamp(min=0)  # [n, P]
    scores = scores_after(selector, values, cand, prev, hidden.detach())
    hit = cand == targets[..., None]  # [n, P, K]
    ok = hit.any(-1) & (targets >= 0)
    labelled = int((targets >= 0).sum())
    if not bool(ok.any()):
        return scores.sum() * 0.0, 0.0
    w = weights.to(scores.device)[None, :].expand_as(targets)[ok]
    ce = F.cross_entropy(scores[ok], hit.float().argmax(-1)[ok], reduction="none")
    return (ce * w).sum() / w.sum(), float(ok.sum()) / max(labelled, 1)


@torch.no_grad()
def selector_drafts(
    selector, hidden: torch.Tensor, anchor_ids: torch.Tensor, head: torch.Tensor, vocab: torch.Tensor | None
) -> torch.Tensor:
    """The greedy draft serving makes (draft.propose: the selector's walk through the candidates):
    hidden [n, P, H]; anchor_ids [n] -> token ids [n, P]."""
    values, cand = selector_candidates(selector, hidden, head, vocab)
    edges = selector.edges(anchor_ids, cand, values, hidden)  # [n, P, K, K]
    return cand.gather(2, greedy_path(edges, selector.walk)[..., None]).squeeze(2)
