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

import glob
import json
import math
import os
import sys
import time

import torch

from sglang_dflash.model.config import parse_drafter_config
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.draft_vocab import coverage, d2t_from_ids, most_frequent
from sglang_dflash.train.corpus import ID_PREFIX
from sglang_dflash.train.blocks import Seq, block_hidden, eval_tau, sample_anchors, walk_tau
from sglang_dflash.train.features import load_seqs
from sglang_dflash.train.head_loss import head_cross_entropy
from sglang_dflash.train.warm_start import parent_vocab, warm_start


def drafter_config_dict(
    target_cfg: dict, num_layers: int, block_size: int, layer_ids: list[int], mask_token_id: int
) -> dict:
    """A z-lab style config.json for a drafter shaped like the target's layers."""
    t = target_cfg
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": t["hidden_size"],
        "num_hidden_layers": num_layers,
        "num_attention_heads": t["num_attention_heads"],
        "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"],
        "intermediate_size": t["intermediate_size"],
        "vocab_size": t["vocab_size"],
        "rms_norm_eps": 1e-6,
        "rope_theta": t.get("rope_theta", 10000.0),
        "hidden_act": "silu",
        "max_position_embeddings": t.get("max_position_embeddings", 8192),
        "tie_word_embeddings": False,
        "block_size": block_size,
        "num_target_layers": t["num_hidden_layers"],
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": layer_ids},
        "torch_dtype": "bfloat16",
    }


MASK_TOKEN = "<empty_output>"  # an unused special token of the SmolLM2 tokenizer (id 16)


def mask_token_id_for(model: str) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tid = tok.convert_tokens_to_ids(MASK_TOKEN)
    return int(tid) if isinstance(tid, int) and tid != tok.unk_token_id else len(tok) - 1


def load_target_tensor(model: str, names=("lm_head.weight", "model.embed_tokens.weight")) -> torch.Tensor:
    """The first of `names` found in the target's safetensors, as stored (bf16)."""
    from safetensors import safe_open

    for f in sorted(glob.glob(os.path.join(model, "*.safetensors"))):
        with safe_open(f, "pt") as st:
            for k in names:
                if k in st.keys():
                    return st.get_tensor(k)
    raise FileNotFoundError(f"none of {names} in {model}")


def load_embedding(model: str) -> torch.Tensor:
    """The target's (tied) embedding = LM head weight [V, H], frozen (bf16)."""
    return load_target_tensor(model)


def lr_factor(step: int, frac: float, warmup: int = 60) -> float:
    """Linear warm-up, then cosine over the time budget (frac in [0, 1]) down to 10%."""
    return min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0))))


def save(path: str, **state):
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def run(
    workdir: str,
    model: str,
    *,
    num_layers: int = 2,
    block_size: int = 16,
    steps: int = 100000,
    lr: float = 2e-3,
    anchors: int = 8,
    seqs: int = 16,
    ckpt_minutes: float = 3.0,
    deadline: float | None = None,
    resume: bool = True,
    command: str = "",
    gamma: float = 4.0,
    eval_anchors: int = 600,
    seed: int = 0,
    negatives: int = 8192,
    draft_vocab: int = 0,
    walk_seqs: int = 40,
    no_text: bool = False,
    init_from: str | None = None,
    extra_features: list[str] | tuple = (),
    warmup: int = 60,
    keep_draft_vocab: bool = False,
) -> dict:
    """Train until `steps` or `deadline` (epoch s), checkpointing every ckpt_minutes (held-out tau each
    time; best.pt keeps the best). anchors per sequence x seqs sequences per step. On SmolLM2, moving
    from 4 x 32 (lr 1e-3, gamma 7) to 16 x 8 (lr 2e-3, gamma 4) took held-out tau from 1.11 to 1.8 in
    300 steps (the three were changed together).
    negatives: tokens outside the answers' vocabulary added to the softmax each step (sampled
    anew every step; >= their count means the full vocabulary). Without them the drafter's argmax
    over the full LM head lands on tokens it never saw pushed down.
    draft_vocab N > 0: a reduced draft vocabulary, the N most frequent labels of the training data
    (model/draft_vocab.py); the softmax is over exactly those N (no negatives needed) and the
    checkpoint carries d2t. Checkpoints are ranked by the serving-equivalent walk tau over the first
    128 tokens of walk_seqs held-out answers; the per-anchor tau is logged beside it.
    init_from: an exported drafter folder to start from (warm_start.py); a resumed last.pt wins.
    extra_features: earlier runs' workdirs whose train split is trained on too (load_seqs).
    keep_draft_vocab: the init_from drafter's draft vocabulary instead of this run's N most frequent.
    warmup: steps of linear lr warm-up (a warm start's parent ended at 10% of its peak lr)."""
    from tqdm import tqdm

    torch.manual_seed(seed)
    with open(os.path.join(workdir, "features", "meta.json")) as f:
        layer_ids = json.load(f)["target_layer_ids"]
    with open(os.path.join(model, "config.json")) as f:
        tcfg = json.load(f)
    per_dir: dict = {}
    train, held = load_seqs(workdir, extra_features, per_dir)
    train = [s for s in train if s.tokens.shape[0] - s.answer_start >= 2]
    if no_text:  # answers only: the corpus documents' features stay on disk, unused
        train = [s for s in train if not s.id.startswith(ID_PREFIX)]
    counts = torch.bincount(torch.cat([_labels(s) for s in train]), minlength=tcfg["vocab_size"])
    cdict = drafter_config_dict(tcfg, num_layers, block_size, layer_ids, mask_token_id_for(model))
    if keep_draft_vocab:  # the parent's, chosen by the whole chain's labels
        dv = parent_vocab(init_from)
        draft_vocab = dv.numel()
    else:
        dv = most_frequent(counts, draft_vocab) if draft_vocab else None  # [N] token ids the drafter scores
    if dv is not None:
        cdict["draft_vocab_size"] = draft_vocab
    cfg = parse_drafter_config(cdict, tcfg["num_hidden_layers"])
    drafter = DFlashDrafter(cfg)
    if dv is not None:
        drafter.d2t.copy_(d2t_from_ids(dv))
    for name, p in drafter.named_parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    with torch.no_grad():  # the LM head expects hidden states scaled like the target's final norm output
        drafter.norm.weight.copy_(load_target_tensor(model, ("model.norm.weight",)).float())
    embed = load_embedding(model)  # [V, H] bf16, frozen
    vocab = dv if dv is not None else (counts > 0).nonzero().squeeze(1)  # token ids the softmax covers
    if dv is not None:
        negatives = 0
    comp = torch.ones(embed.shape[0], dtype=torch.bool)
    comp[vocab] = False
    comp = comp.nonzero().squeeze(1)  # tokens never in a train answer: sampled as extra negatives
    fixed_head = embed[vocab].to(torch.bfloat16)  # [V_sub, H]: the head when no negatives are sampled
    remap = torch.full((embed.shape[0],), -100, dtype=torch.int64)
    remap[vocab] = torch.arange(vocab.numel())
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    cdir = os.path.join(workdir, "ckpt")
    os.makedirs(cdir, exist_ok=True)
    last, best = os.path.join(cdir, "last.pt"), os.path.join(cdir, "best.pt")
    st = {"step": 0, "train_s": 0.0, "best_tau": 0.0, "start": time.time(), "history": []}
    if init_from:
        warm_start(drafter, cfg, init_from, tcfg["num_hidden_layers"])
    if resume and os.path.exists(last):
        ck = torch.load(last, weights_only=False)
        drafter.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        st = ck["state"]
        print(f"trainer: resumed at step {st['step']}", file=sys.stderr)
    end = deadline or (time.time() + 3600)
    # The cosine runs over training seconds, so a resumed run continues it from where it stopped,
    # stretched over the time left (not over wall time since the first start, which a pause eats).
    budget = max(st["train_s"] + end - time.time(), 1.0)
    g = torch.Generator().manual_seed(seed + st["step"])
    eval_set = sample_anchors(held, eval_anchors, block_size, torch.Generator().manual_seed(1234), spread=True)
    weights = torch.exp(-torch.arange(block_size - 1, dtype=torch.float32) / gamma)  # [B-1]
    n_params = sum(p.numel() for p in drafter.parameters()) / 1e6
    print(
        f"reproduce: {command}\ntrainer: {len(train)} train / {len(held)} held-out seqs, "
        f"{sum(s.tokens.shape[0] - s.answer_start for s in train)} train answer tokens, vocab subset "
        f"{vocab.numel()} + {min(negatives, comp.numel())} sampled negatives, drafter {n_params:.2f}M params, "
        f"target_layer_ids {layer_ids}, mask {cdict['dflash_config']['mask_token_id']}, "
        f"label coverage of the vocabulary {coverage(counts, vocab):.4f}",
        file=sys.stderr,
        flush=True,
    )

    def checkpoint():
        drafter.eval()
        anchor_tau = eval_tau(drafter, embed, cfg.mask_token_id, block_size, eval_set, vocab=dv)
        tau = walk_tau(drafter, embed, cfg.mask_token_id, block_size, held[:walk_seqs], 128, vocab=dv)
        drafter.train()
        row = {"step": st["step"], "train_s": round(st["train_s"], 1), "tokens": st.get("tokens", 0)}
        st["history"].append({**row, "tau": tau, "anchor_tau": anchor_tau})
        print(f"trainer: step {st['step']} held-out walk tau {tau:.3f} (per anchor {anchor_tau:.3f})", file=sys.stderr)
        sd = {k: v.detach().clone() for k, v in drafter.state_dict().items()}
        if tau > st["best_tau"]:
            st["best_tau"] = tau
            save(best, model=sd, config=cdict, state=dict(st), tau=tau)
        save(last, model=sd, opt=opt.state_dict(), config=cdict, state=st)
        with open(os.path.join(workdir, "train_log.jsonl"), "a") as f:
            f.write(json.dumps(st["history"][-1]) + "\n")

    if init_from and st["step"] == 0:  # the start is a candidate: a warm run never exports below it
        checkpoint()
    drafter.train()
    bar = tqdm(total=steps, initial=st["step"], desc="train", mininterval=10)
    t_ck, tokens, t0, losses = time.time(), 0, time.time(), []
    while st["step"] < steps and time.time() < end:
        ts = time.time()
        picks = torch.randint(len(train), (seqs,), generator=g).tolist()
        batch = sample_anchors([train[i] for i in picks], anchors * seqs, block_size, g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden, targets = block_hidden(drafter, embed, cfg.mask_token_id, block_size, batch)
        # hidden [n, B-1, H] rows 1..B-1; targets [n, B-1] token ids (-100 past the sequence end)
        tgt = torch.where(targets >= 0, remap[targets.clamp(min=0)], torch.full_like(targets, -100))
        negs = comp[torch.randperm(comp.numel(), generator=g)[:negatives]]
        # [V_sub + neg, H]; targets index the first V_sub. Without negatives it never changes: gathered once.
        head = embed[torch.cat([vocab, negs])].to(torch.bfloat16) if negs.numel() else fixed_head
        n, k, h = hidden.shape  # the head's logits are most of a step: fused, chunked (head_loss.py)
        loss = head_cross_entropy(hidden.reshape(n * k, h), head, tgt.flatten(), weights.expand(n, k).flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        for grp in opt.param_groups:
            grp["lr"] = lr * lr_factor(st["step"], st["train_s"] / budget, warmup)
        opt.step()
        st["step"] += 1
        st["train_s"] += time.time() - ts
        tokens += int((tgt >= 0).sum())
        st["tokens"] = st.get("tokens", 0) + int((tgt >= 0).sum())
        losses.append(loss.item())
        bar.update(1)
        acc = ((hidden[:, 0].detach().to(head.dtype) @ head.t()).argmax(-1) == tgt[:, 0]).float().mean()
        bar.set_postfix(
            loss=f"{loss.item():.3f}", acc1=f"{acc:.2f}", tok_s=f"{tokens / (time.time() - t0):.0f}", refresh=False
        )
        if time.time() - t_ck > ckpt_minutes * 60:
            checkpoint()
            t_ck = time.time()
    bar.close()
    if not st["history"] or st["history"][-1]["step"] != st["step"]:
        checkpoint()
    first, final = losses[:5] or [0.0], losses[-5:] or [0.0]  # mean loss of the first and last 5 steps
    out = {
        "steps": st["step"],
        "train_s": round(st["train_s"], 1),
        "best_tau": st["best_tau"],
        "tok_s": round(tokens / max(time.time() - t0, 1e-9), 1),
        "loss_first": sum(first) / len(first),
        "loss_last": sum(final) / len(final),
    }
    summary = dict(out, anchors_per_step=anchors * seqs, train_seqs=len(train), heldout_seqs=len(held))
    summary |= dict(gamma=gamma, draft_vocab=draft_vocab, no_text=no_text, init_from=init_from, lr=lr)
    summary |= dict(warmup=warmup, keep_draft_vocab=keep_draft_vocab)
    summary |= dict(extra_features=list(extra_features), train_seqs_by_workdir=per_dir)
    summary |= dict(walk_seqs=min(walk_seqs, len(held)), label_coverage=coverage(counts, vocab))
    summary |= dict(threads=torch.get_num_threads(), command=command, history=st["history"])
    with open(os.path.join(workdir, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("trainer:", json.dumps(out), file=sys.stderr)
    return out


def _labels(s: Seq) -> torch.Tensor:
    """The labels a sequence trains on (answer part): the target's greedy next tokens."""
    lab = s.tokens[s.answer_start + 1 :] if s.labels is None else s.labels[s.answer_start :]
    return lab[lab >= 0]
