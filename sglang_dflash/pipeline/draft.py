"""Stage: draft a whole block in ONE non-causal drafter forward, logits from the target's LM head.

DFlash 1: the proposals are the argmax at every block position. DFlash 2: the selector keeps the
top-k candidates per position and path.py walks one path through them from the anchor (best path
for greedy requests; a sampled path with its distribution q for sampled ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.path_walk import greedy_path, sample_path
from sglang_dflash.pipeline.noise import WALK, gumbel

# attend(layer, q [N, H, D], k_blk [N, Hkv, D], v_blk [N, Hkv, D]) -> [N, H, D]; see attention.py
BlockAttention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Proposal:
    tokens: torch.Tensor  # [bs, B]: column 0 the anchor, columns 1.. the proposals
    cand_ids: Optional[torch.Tensor] = None  # [bs, B-1, K] DFlash 2 candidates per proposal slot
    q: Optional[torch.Tensor] = None  # [bs, B-1, K] the distribution each sampled slot was drawn from
    q_rows: Optional[torch.Tensor] = None  # [bs] bool: rows drawn from q (verified by rejection); None: all
    failed: Optional[torch.Tensor] = None  # [bs] bool: rows whose draft was not finite (bare block verified)

    def first(self, width: int) -> "Proposal":
        """The first `width` block rows (anchor + width-1 drafts): what a width-W step verifies."""
        if width >= self.tokens.shape[1]:
            return self
        cut = lambda t: None if t is None else t[:, : width - 1]  # noqa: E731
        return Proposal(self.tokens[:, :width], cut(self.cand_ids), cut(self.q), self.q_rows, self.failed)


def draft_rows(width: Optional[int], block: int, selector=None) -> int:
    """The block rows a width-W step drafts: [anchor, MASK x (W-1)], exactly the rows it verifies.
    The mask rows past W cost a drafter forward as much as the verified ones yet barely move the
    verified drafts (bench/draft_block.py: walk tau at W within a few percent of the whole block's,
    the draft at a quarter of the rows several times cheaper). A DFlash 2 drafter keeps its whole
    trained block: its selector's convolutions and path walk were trained on it."""
    if width is None or width >= block or selector is not None:
        return block
    return max(width, 2)


def finite_rows(x: torch.Tensor) -> torch.Tensor:
    """x [bs, ...] -> [bs] bool: every value of the row finite (no NaN, no inf)."""
    return torch.isfinite(x).flatten(1).all(dim=1)


def guard(proposal: Proposal, block_ids: torch.Tensor, ok: torch.Tensor) -> Proposal:
    """A faulty drafter may slow a request down but never change a token: rows whose drafter output
    or q is not finite (ok False) verify the bare block [anchor, MASK...] with no q, so their tokens
    are the target's own samples (an argmax over NaN is still a valid index, and a NaN q would make
    the rejection residual NaN and its draw arbitrary). block_ids [bs, B]; ok [bs] bool."""
    if proposal.q is not None:
        ok = ok & finite_rows(proposal.q)
    bad = ~ok
    width = proposal.tokens.shape[1]
    tokens = torch.where(bad[:, None], block_ids[:, :width], proposal.tokens)
    q_rows = None
    if proposal.q is not None:
        q_rows = ok if proposal.q_rows is None else proposal.q_rows & ok
    return Proposal(tokens, proposal.cand_ids, proposal.q, q_rows, bad)


@torch.inference_mode()
def propose(
    drafter: DFlashDrafter,
    attend: BlockAttention,
    embed: Callable[[torch.Tensor], torch.Tensor],
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    block_ids: torch.Tensor,
    positions: torch.Tensor,
    temperatures: Optional[torch.Tensor] = None,
    gumbel: Optional[torch.Tensor] = None,
    width: Optional[int] = None,
    sampled_slots: int = 0,
    sampled: Optional[bool] = None,
) -> Proposal:
    """block_ids, positions [bs, B]; attend: non-causal attention over context + block per request.
    embed: token ids [N] -> [N, H] (the target's); logits_fn: [N, H] -> [N, V] (the target's LM head;
    [N, draft_vocab_size] for a drafter with a reduced vocabulary, whose indices drafter.to_target maps).
    temperatures [bs] (> 0: that row's path is sampled, with its q kept for rejection; <= 0: the
    best path, a point mass) and gumbel [bs, B-1, K] noise: sampled DFlash 2 paths.
    width: the step verifies only the first W rows: the block is drafted whole (the drafter's trained
    size, every row in every attention), but for a DFlash 1 drafter the last layer's MLP and the LM
    head (a [rows, vocab] matmul) run on those W rows / W-1 slots only; so for a DFlash 2 drafter that
    walks the chain (Viterbi reads every slot).
    sampled_slots (DFlash 1): rows with temperature > 0 draw their first sampled_slots drafts from
    the drafter's own q (see sample_drafts); gumbel [bs, B-1, DRAFT_TOP_K] is their noise.
    sampled: whether some row of temperatures is > 0, known on the host (draft_sampling), so the
    step never reads a device value back (a CUDA graph cannot capture that); None: checked here."""
    bs, block = block_ids.shape
    selector = drafter.selector
    if temperatures is not None and sampled is None:
        sampled = bool((temperatures > 0).any())
    sampled = temperatures is not None and bool(sampled)
    # A chain walk (greedy and sampled) reads slot j's edges after slot j-1's pick only, so a width-W
    # step needs W-1 slots; Viterbi's best path reads every slot.
    whole = width is None or (selector is not None and selector.walk != "chain")
    keep = block if whole else width
    x = embed(block_ids.reshape(-1)).to(drafter.fc.weight.dtype)  # [bs*B, H]
    hidden = drafter(x, positions.reshape(-1), attend, block, keep).view(bs, keep, -1)
    slots = hidden[:, 1:, :]  # [bs, keep-1, H]
    ok = finite_rows(slots)  # NaN / inf hidden rows (a broken checkpoint, half-precision overflow)
    logits = logits_fn(slots.reshape(bs * (keep - 1), -1)).view(bs, keep - 1, -1)  # [bs, keep-1, V]
    out = block_ids[:, :keep].clone()
    if selector is None:
        if sampled_slots and sampled:
            drafts = sample_drafts(out, logits, temperatures, sampled_slots, gumbel, drafter.to_target)
            return guard(drafts, block_ids, ok)
        out[:, 1:] = drafter.to_target(logits.float().argmax(dim=-1))  # float32: vectorized on CPU, same ties
        return guard(Proposal(out), block_ids, ok)
    values, cand = selector.candidates(logits)  # [bs, B-1, K]
    cand = drafter.to_target(cand)
    edges = selector.edges(block_ids[:, 0], cand, values, slots)  # [bs, B-1, K, K]
    idx, q, rows = greedy_path(edges, selector.walk), None, None
    if sampled:
        rows = temperatures > 0
        sampled_idx, q = sample_path(edges, temperatures.clamp_min(1e-6), gumbel)
        idx = torch.where(rows[:, None], sampled_idx, idx)
    out[:, 1:] = cand.gather(2, idx[..., None]).squeeze(2)
    return guard(Proposal(out, cand, q, rows), block_ids, ok)


DRAFT_TOP_K = 32  # a sampled DFlash 1 draft is drawn from the drafter's q over its top 32 tokens


def sample_drafts(out, logits, temperatures, n_sampled: int, gumbel, to_target=lambda i: i) -> Proposal:
    """DFlash 1 drafts for sampled rows: slot j < n_sampled is drawn from q_j = softmax(top-K
    drafter logits / T) (renormalized over the top K: any proposal distribution keeps rejection
    sampling exact, as long as verify uses the same q); later slots are the argmax with a one-hot q
    (rejection against a point mass is sample-and-match). Rows with T <= 0 get argmax drafts and are
    not verified by rejection (q_rows False).
    out [bs, P+1] (column 0 the anchor); logits [bs, P, V]; temperatures [bs]; gumbel [bs, >=P, K];
    to_target maps logit indices to target ids (a reduced draft vocabulary)."""
    bs, p, _ = logits.shape
    vals, cand = logits.float().topk(min(DRAFT_TOP_K, logits.shape[-1]), dim=-1)  # [bs, P, K], descending
    cand = to_target(cand)
    rows = temperatures > 0
    q = torch.softmax(vals / temperatures.clamp_min(1e-6).float()[:, None, None], dim=-1)
    idx = (q.log() + gumbel[:, :p, : q.shape[-1]]).argmax(dim=-1)  # Gumbel-max: a draw from q
    point = torch.zeros_like(q)
    point[..., 0] = 1.0  # the argmax, as a point mass
    slot_sampled = (torch.arange(p, device=logits.device) < n_sampled)[None, :] & rows[:, None]  # [bs, P]
    idx = torch.where(slot_sampled, idx, 0)
    q = torch.where(slot_sampled[..., None], q, point)
    out[:, 1:] = cand.gather(2, idx[..., None]).squeeze(2)
    return Proposal(out, cand, q, rows)


def draft_sampling(sampling, selector_k: Optional[int], block: int, rule: str, device):
    """A batch's SamplingRows (None: all greedy) -> (temperatures [bs], gumbel [bs, B-1, K], sampled
    slots) for propose(): DFlash 2 (selector_k = its K) samples paths; DFlash 1 draws drafts from q
    under rule "q1" / "qall" ("argmax": point masses only). Seeded rows always draft a point mass,
    verified by sample-and-match, so their tokens depend only on (seed, position) whatever the verify
    widths and the batch (a rejection against q depends on where blocks start, and widths move that).
    temperatures None: no row draws from q (then propose needs no sampled check)."""
    if sampling is None or (selector_k is None and rule == "argmax"):
        return None, None, 0
    seeds = sampling.seeds or [None] * sampling.temperatures.numel()
    if sampling.sampled is not None and not any(f and s is None for f, s in zip(sampling.sampled, seeds)):
        return None, None, 0  # every row greedy or seeded: point masses (known on the host, no sync)
    temps = sampling.temperatures.reshape(-1).to(device)
    seeded = torch.tensor([s is not None for s in seeds], device=device)
    temps = torch.where(seeded, 0.0, temps)
    k = selector_k if selector_k is not None else DRAFT_TOP_K
    noise = gumbel(len(temps), block - 1, k, None, None, WALK, device)
    return temps, noise, 0 if selector_k is not None else 1 if rule == "q1" else block - 1
