"""Stage 3: DFlash training of a DFlashDrafter on the stored target features.

For an anchor at answer position p the drafter sees the context features of tokens [0, p) (fc +
hidden_norm -> K/V in every layer, k_norm + RoPE at absolute positions, exactly
DFlashDrafter.context_kv) and the block [token_p, MASK x (B-1)] at positions p..p+B-1, with
non-causal attention over its own context + its own block (blocks.py builds the mask), run
through the same DFlashDrafter.forward the server runs. Logits come from the target's frozen tied
embedding over block rows 1..B-1; cross-entropy against tokens p+1..p+B-1 weighted
exp(-(k-1)/gamma). The held-out metric is offline tau (blocks.offline_tau).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from sglang_dflash.model.config import parse_drafter_config
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.draft_vocab import coverage, d2t_from_ids, most_frequent
from sglang_dflash.train.corpus import ID_PREFIX
from sglang_dflash.train.blocks import Seq, anchor_ids, block_hidden, block_soft, eval_tau, sample_anchors, walk_tau
from sglang_dflash.train.dflash2 import dflash2_fields, param_groups, selector_loss
from sglang_dflash.train.features import load_seqs
from sglang_dflash.train.head_loss import head_cross_entropy, soft_rows
from sglang_dflash.train.tempered_distil import temper
from sglang_dflash.train.target_files import drafter_config_dict, load_embedding, load_target_tensor, mask_token_id_for
from sglang_dflash.train.warm_start import parent_vocab, warm_start


def lr_factor(step: int, frac: float, warmup: int = 60) -> float:
    """Linear warm-up, then cosine over the time budget (frac in [0, 1]) down to 10%."""
    return min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0))))


def save(path: str, **state):
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


@dataclass
class TrainConfig:
    """One training run. anchors per sequence x seqs sequences per step; training stops at `steps` or
    `deadline` (epoch s), checkpointing every ckpt_minutes (held-out walk tau each time; best.pt keeps
    the best). On SmolLM2, moving from 4 x 32 (lr 1e-3, gamma 7) to 16 x 8 (lr 2e-3, gamma 4) took
    held-out tau from 1.11 to 1.8 in 300 steps (the three were changed together).
    negatives: tokens outside the answers' vocabulary added to the softmax each step (sampled anew
    every step; >= their count means the full vocabulary). Without them the drafter's argmax over
    the full LM head lands on tokens it never saw pushed down.
    draft_vocab N > 0: a reduced draft vocabulary, the N most frequent labels of the training data
    (model/draft_vocab.py); the softmax is over exactly those N (no negatives needed) and the
    checkpoint carries d2t. Checkpoints are ranked by the serving-equivalent walk tau over the first
    128 tokens of walk_seqs held-out answers; the per-anchor tau is logged beside it.
    init_from: an exported drafter folder to start from (warm_start.py); a resumed last.pt wins.
    extra_features: earlier runs' workdirs whose train split is trained on too (load_seqs).
    keep_draft_vocab: the init_from drafter's draft vocabulary instead of this run's N most frequent.
    warmup: steps of linear lr warm-up (a warm start's parent ended at 10% of its peak lr).
    distil: the weight of the target's own top-k distribution (features' topk) beside the hard
    label (head_loss.py); 0 trains on the hard labels alone."""

    workdir: str
    model: str
    num_layers: int = 2
    block_size: int = 16
    steps: int = 100000
    lr: float = 2e-3
    anchors: int = 8
    seqs: int = 16
    ckpt_minutes: float = 3.0
    deadline: Optional[float] = None
    resume: bool = True
    command: str = ""
    gamma: float = 4.0
    eval_anchors: int = 600
    seed: int = 0
    negatives: int = 8192
    draft_vocab: int = 0
    walk_seqs: int = 40
    no_text: bool = False
    init_from: Optional[str] = None
    extra_features: Sequence[str] = ()
    warmup: int = 60
    keep_draft_vocab: bool = False
    distil: float = 0.0
    distil_temperature: float = 1.0  # the loss at the served temperature (tempered_distil.py)


class _Run:
    """A run's data, drafter, optimizer and progress state (built once by __init__)."""

    def __init__(self, c: TrainConfig):
        torch.manual_seed(c.seed)
        self.c = c
        with open(os.path.join(c.workdir, "features", "meta.json")) as f:
            self.layer_ids = json.load(f)["target_layer_ids"]
        with open(os.path.join(c.model, "config.json")) as f:
            tcfg = json.load(f)
        self.per_dir: dict = {}
        train, self.held = load_seqs(c.workdir, c.extra_features, self.per_dir)
        train = [s for s in train if s.tokens.shape[0] - s.answer_start >= 2]
        if c.no_text:  # answers only: the corpus documents' features stay on disk, unused
            train = [s for s in train if not s.id.startswith(ID_PREFIX)]
        self.train = train
        self.counts = torch.bincount(torch.cat([_labels(s) for s in train]), minlength=tcfg["vocab_size"])
        self.cdict = drafter_config_dict(tcfg, c.num_layers, c.block_size, self.layer_ids, mask_token_id_for(c.model))
        self.draft_vocab = c.draft_vocab
        if c.keep_draft_vocab:  # the parent's, chosen by the whole chain's labels
            self.dv = parent_vocab(c.init_from)
            self.draft_vocab = self.dv.numel()
        else:  # [N] token ids the drafter scores
            self.dv = most_frequent(self.counts, c.draft_vocab) if c.draft_vocab else None
        if self.dv is not None:
            self.cdict["draft_vocab_size"] = self.draft_vocab
        if c.init_from:  # a DFlash 2 parent (dflash2.upgrade) trains as DFlash 2
            self.cdict["dflash_config"].update(dflash2_fields(c.init_from))
        self.cfg = parse_drafter_config(self.cdict, tcfg["num_hidden_layers"])
        self.drafter = _init_drafter(self.cfg, self.dv, c.model)
        self.embed = load_embedding(c.model)  # [V, H] bf16, frozen
        self.vocab = self.dv if self.dv is not None else (self.counts > 0).nonzero().squeeze(1)  # softmax ids
        self.negatives = 0 if self.dv is not None else c.negatives
        comp = torch.ones(self.embed.shape[0], dtype=torch.bool)
        comp[self.vocab] = False
        self.comp = comp.nonzero().squeeze(1)  # tokens never in a train answer: sampled as extra negatives
        self.fixed_head = self.embed[self.vocab].to(torch.bfloat16)  # [V_sub, H]: the head without negatives
        self.remap = torch.full((self.embed.shape[0],), -100, dtype=torch.int64)
        self.remap[self.vocab] = torch.arange(self.vocab.numel())
        self.opt = torch.optim.AdamW(param_groups(self.drafter), lr=c.lr, betas=(0.9, 0.95), weight_decay=0.01)
        cdir = os.path.join(c.workdir, "ckpt")
        os.makedirs(cdir, exist_ok=True)
        self.last, self.best = os.path.join(cdir, "last.pt"), os.path.join(cdir, "best.pt")
        self.st = {"step": 0, "train_s": 0.0, "best_tau": 0.0, "start": time.time(), "history": []}
        if c.init_from:
            warm_start(self.drafter, self.cfg, c.init_from, tcfg["num_hidden_layers"])
        if c.resume and os.path.exists(self.last):
            ck = torch.load(self.last, weights_only=False)
            self.drafter.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["opt"])
            self.st = ck["state"]
            print(f"trainer: resumed at step {self.st['step']}", file=sys.stderr)
        g = torch.Generator().manual_seed(1234)
        self.eval_set = sample_anchors(self.held, c.eval_anchors, c.block_size, g, spread=True)
        self.weights = torch.exp(-torch.arange(c.block_size - 1, dtype=torch.float32) / c.gamma)  # [B-1]

    def describe(self) -> str:
        n_params = sum(p.numel() for p in self.drafter.parameters()) / 1e6
        return (
            f"reproduce: {self.c.command}\ntrainer: {len(self.train)} train / {len(self.held)} held-out seqs, "
            f"{sum(s.tokens.shape[0] - s.answer_start for s in self.train)} train answer tokens, vocab subset "
            f"{self.vocab.numel()} + {min(self.negatives, self.comp.numel())} sampled negatives, drafter "
            f"{n_params:.2f}M params, target_layer_ids {self.layer_ids}, mask "
            f"{self.cdict['dflash_config']['mask_token_id']}, label coverage of the vocabulary "
            f"{coverage(self.counts, self.vocab):.4f}"
        )

    def evaluate(self) -> tuple[float, float]:
        """(walk tau over the first 128 tokens of walk_seqs held-out answers, per-anchor tau)."""
        c, d = self.c, self.drafter
        d.eval()
        anchor_tau = eval_tau(d, self.embed, self.cfg.mask_token_id, c.block_size, self.eval_set, vocab=self.dv)
        held = self.held[: c.walk_seqs]
        tau = walk_tau(d, self.embed, self.cfg.mask_token_id, c.block_size, held, 128, vocab=self.dv)
        d.train()
        return tau, anchor_tau

    def checkpoint(self) -> None:
        st = self.st
        tau, anchor_tau = self.evaluate()
        row = {"step": st["step"], "train_s": round(st["train_s"], 1), "tokens": st.get("tokens", 0)}
        st["history"].append({**row, "tau": tau, "anchor_tau": anchor_tau})
        print(f"trainer: step {st['step']} held-out walk tau {tau:.3f} (per anchor {anchor_tau:.3f})", file=sys.stderr)
        sd = {k: v.detach().clone() for k, v in self.drafter.state_dict().items()}
        if tau > st["best_tau"]:
            st["best_tau"] = tau
            save(self.best, model=sd, config=self.cdict, state=dict(st), tau=tau)
        save(self.last, model=sd, opt=self.opt.state_dict(), config=self.cdict, state=st)
        with open(os.path.join(self.c.workdir, "train_log.jsonl"), "a") as f:
            f.write(json.dumps(st["history"][-1]) + "\n")

    def step(self, g: torch.Generator, budget: float) -> tuple[float, int, float]:
        """One optimizer step -> (loss, labelled tokens, first-slot accuracy)."""
        c, st = self.c, self.st
        ts = time.time()
        picks = torch.randint(len(self.train), (c.seqs,), generator=g).tolist()
        batch = sample_anchors([self.train[i] for i in picks], c.anchors * c.seqs, c.block_size, g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden, targets = block_hidden(self.drafter, self.embed, self.cfg.mask_token_id, c.block_size, batch)
        # hidden [n, B-1, H] rows 1..B-1; targets [n, B-1] token ids (-100 past the sequence end)
        tgt = torch.where(targets >= 0, self.remap[targets.clamp(min=0)], torch.full_like(targets, -100))
        negs = self.comp[torch.randperm(self.comp.numel(), generator=g)[: self.negatives]]
        # [V_sub + neg, H]; targets index the first V_sub. Without negatives it never changes: gathered once.
        head = self.embed[torch.cat([self.vocab, negs])].to(torch.bfloat16) if negs.numel() else self.fixed_head
        n, k, h = hidden.shape  # the head's logits are most of a step: fused, chunked (head_loss.py)
        soft = block_soft(batch, c.block_size) if c.distil else None
        if c.distil and soft is None:
            raise ValueError("--distil needs features with the target's top-k (features stage of this version)")
        if soft is not None:  # [n*k, K] head rows and their probabilities
            soft = soft_rows(soft[0].flatten(0, 1), soft[1].flatten(0, 1), self.remap)
        w = self.weights.expand(n, k).flatten()
        x, soft = temper(hidden.reshape(n * k, h), soft, c.distil_temperature)  # KL(p_T || q_T) at the served T
        loss = head_cross_entropy(x, head, tgt.flatten(), w, soft=soft, alpha=c.distil)
        if self.drafter.selector is not None:  # DFlash 2: the selector's own loss (dflash2.py)
            sel_head, sel_vocab = (self.fixed_head, self.vocab) if self.dv is not None else (self.embed, None)
            sel_loss, covered = selector_loss(
                self.drafter.selector, hidden.float(), anchor_ids(batch), targets, sel_head, sel_vocab, self.weights
            )
            loss = loss + sel_loss
            st["selector_covered"] = covered
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), 1.0)
        for grp in self.opt.param_groups:
            grp["lr"] = c.lr * grp.get("lr_mult", 1.0) * lr_factor(st["step"], st["train_s"] / budget, c.warmup)
        self.opt.step()
        labelled = int((tgt >= 0).sum())
        st["step"] += 1
        st["train_s"] += time.time() - ts
        st["tokens"] = st.get("tokens", 0) + labelled
        acc = ((hidden[:, 0].detach().to(head.dtype) @ head.t()).argmax(-1) == tgt[:, 0]).float().mean()
        return loss.item(), labelled, float(acc)

    def summary(self, out: dict) -> dict:
        c, held = self.c, self.held
        summary = dict(out, anchors_per_step=c.anchors * c.seqs, train_seqs=len(self.train), heldout_seqs=len(held))
        summary |= dict(gamma=c.gamma, draft_vocab=self.draft_vocab, no_text=c.no_text, init_from=c.init_from, lr=c.lr)
        summary |= dict(warmup=c.warmup, keep_draft_vocab=c.keep_draft_vocab, distil=c.distil, anchors=c.anchors)
        summary |= dict(extra_features=list(c.extra_features), train_seqs_by_workdir=self.per_dir)
        summary |= dict(walk_seqs=min(c.walk_seqs, len(held)), distil_temperature=c.distil_temperature)
        summary |= dict(label_coverage=coverage(self.counts, self.vocab), dflash2=self.cfg.dflash2 is not None)
        return summary | dict(threads=torch.get_num_threads(), command=c.command, history=self.st["history"])


def _init_drafter(cfg, dv, model: str) -> DFlashDrafter:
    drafter = DFlashDrafter(cfg)
    if dv is not None:
        drafter.d2t.copy_(d2t_from_ids(dv))
    for name, p in drafter.named_parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    with torch.no_grad():  # the LM head expects hidden states scaled like the target's final norm output
        drafter.norm.weight.copy_(load_target_tensor(model, ("model.norm.weight",)).float())
    return drafter


def run(c: TrainConfig) -> dict:
    """Train one run (TrainConfig); writes ckpt/, train_log.jsonl and train_summary.json in the workdir."""
    from tqdm import tqdm

    r = _Run(c)
    st = r.st
    end = c.deadline or (time.time() + 3600)
    # The cosine runs over training seconds, so a resumed run continues it from where it stopped,
    # stretched over the time left (not over wall time since the first start, which a pause eats).
    budget = max(st["train_s"] + end - time.time(), 1.0)
    g = torch.Generator().manual_seed(c.seed + st["step"])
    print(r.describe(), file=sys.stderr, flush=True)
    if c.init_from and st["step"] == 0:  # the start is a candidate: a warm run never exports below it
        r.checkpoint()
    r.drafter.train()
    bar = tqdm(total=c.steps, initial=st["step"], desc="train", mininterval=10)
    t_ck, tokens, t0, losses = time.time(), 0, time.time(), []
    while st["step"] < c.steps and time.time() < end:
        loss, labelled, acc = r.step(g, budget)
        tokens += labelled
        losses.append(loss)
        bar.update(1)
        tok_s = f"{tokens / (time.time() - t0):.0f}"
        bar.set_postfix(loss=f"{loss:.3f}", acc1=f"{acc:.2f}", tok_s=tok_s, refresh=False)
        if time.time() - t_ck > c.ckpt_minutes * 60:
            r.checkpoint()
            t_ck = time.time()
    bar.close()
    if not st["history"] or st["history"][-1]["step"] != st["step"]:
        r.checkpoint()
    first, final = losses[:5] or [0.0], losses[-5:] or [0.0]  # mean loss of the first and last 5 steps
    out = {
        "steps": st["step"],
        "train_s": round(st["train_s"], 1),
        "best_tau": st["best_tau"],
        "tok_s": round(tokens / max(time.time() - t0, 1e-9), 1),
        "loss_first": sum(first) / len(first),
        "loss_last": sum(final) / len(final),
    }
    with open(os.path.join(c.workdir, "train_summary.json"), "w") as f:
        json.dump(r.summary(out), f, indent=1)
    print("trainer:", json.dumps(out), file=sys.stderr)
    return out


def _labels(s: Seq) -> torch.Tensor:
    """The labels a sequence trains on (answer part): the target's greedy next tokens."""
    lab = s.tokens[s.answer_start + 1 :] if s.labels is None else s.labels[s.answer_start :]
    return lab[lab >= 0]
