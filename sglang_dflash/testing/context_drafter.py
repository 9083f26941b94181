"""A tiny target + a drafter TRAINED on its greedy continuations, so drafts depend on the context.

The steered pair (tiny_drafter.py) always proposes one token, so a bug in the drafter's context
K/V, RoPE or block attention cannot change its drafts. Here the target is the cached tiny Llama
with its decoder layers scaled down (LAYER_SCALE): its greedy text then falls into periodic loops
whose tokens depend on the prompt, and a drafter that copies from its context (learned with
sglang_dflash/train's blocks.py forward, the one proven equal to serving per anchor) is accepted
far more often than a random one. Training is a fixed number of steps from fixed seeds, float32,
so the pair is reproducible; it is cached on disk like the other tiny pairs (folder_cache.py).
Measured on 2 cores: about 40-50 s to build; offline tau at block 8 on held-out prompts 2.19
(a random drafter: 1.03). The drafts hinge on the context: another prompt's context features,
context RoPE off by one position, or a causal block mask each change the step count of every
held-out prompt. They hardly depend on the last one or two context rows (the drafter copies from
an earlier period of the loop), so a bug confined to the newest row is not caught by tau alone.

offline_walk() is the reference the server test compares with: blocks.walk_counts (the
serving-equivalent walk) over the target's greedy outputs, with the served drafter's own config
(mask token, block size, target_layer_ids) loaded through the server's loader.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from sglang_dflash.folder_cache import build_once
from sglang_dflash.testing.tiny_models import tiny_model_cache

KIND, SEED = "llama", 0
LAYER_SCALE = 0.1  # decoder-layer weights x this: the embedding dominates, greedy text loops
BLOCK, LAYERS = 8, 2  # drafter block size and depth
TRAIN_PROMPTS, ANSWER = 160, 96  # self-distillation data: random-token prompts, greedy answers
STEPS, LR, GAMMA = 500, 3e-3, 4.0
ANCHORS, SEQS = 8, 16  # anchors per sequence x sequences per step (as the trainer's defaults)
VERSION = "v1"  # bump when anything above changes, so cached pairs are rebuilt


def random_prompts(n: int, seed: int, max_len: int = 40, vocab=(3, 380)) -> list[list[int]]:
    """n random-token prompts (1..max_len tokens, no special ids), deterministic."""
    rng = random.Random(seed)
    return [[rng.randrange(*vocab) for _ in range(rng.randint(1, max_len))] for _ in range(n)]


@torch.inference_mode()
def greedy(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    """The HF target's greedy continuations (n tokens each, EOS not special), with its KV cache.
    Prompts of equal length run as one batch (no padding, so no position or mask bookkeeping)."""
    outs: list = [None] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    for idx in by_len.values():
        o = model(input_ids=torch.tensor([prompts[i] for i in idx]), use_cache=True)
        toks = []
        for _ in range(n):
            nxt = o.logits[:, -1].argmax(-1)  # [b]
            toks.append(nxt)
            o = model(input_ids=nxt[:, None], past_key_values=o.past_key_values, use_cache=True)
        for row, i in enumerate(idx):
            outs[i] = torch.stack(toks, 1)[row].tolist()
    return outs


def make_target(src: str, dst: str, scale: float = LAYER_SCALE) -> str:
    """Copy the HF checkpoint src to dst with every decoder-layer matrix scaled by `scale`
    (embedding, LM head and norms untouched)."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    f = os.path.join(dst, "model.safetensors")
    w = load_file(f)
    for k, v in w.items():
        if k.startswith("model.layers.") and v.dim() == 2:
            w[k] = v * scale
    save_file({k: v.contiguous() for k, v in w.items()}, f)
    return dst


@dataclass
class Reference:
    """The target (HF, float32) and a drafter as the server loads them, for offline drafting."""

    target: object  # HF causal LM
    drafter: object  # DFlashDrafter, float32, eval
    embed: torch.Tensor  # [V, H] the target's input embedding (block tokens)
    head: torch.Tensor  # [V, H] the target's LM head (draft logits); untied in the tiny models
    mask_token_id: int
    layer_ids: list[int]


def load_reference(target_path: str, drafter_path: str) -> Reference:
    from sglang_dflash.model.checkpoint import load_exported
    from sglang_dflash.train.features import load_target
    from sglang_dflash.train.target_files import load_target_tensor

    drafter, cfg, mask = load_exported(drafter_path, target_path, torch.float32)
    embed = load_target_tensor(target_path, ("model.embed_tokens.weight",)).float()
    head = load_target_tensor(target_path, ("lm_head.weight", "model.embed_tokens.weight")).float()
    return Reference(load_target(target_path, torch.float32), drafter, embed, head, mask, cfg.target_layer_ids)


def sequences(ref: Reference, prompts: list[list[int]], outputs: list[list[int]]):
    """-> [Seq] prompt + output with the target's features at the drafter's layer ids [T, K*H]."""
    from sglang_dflash.train.blocks import Seq
    from sglang_dflash.train.features import sequence_features

    seqs = []
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        tokens = torch.tensor(p + o)
        # clone: an inference-mode tensor cannot be saved for backward when training on it
        seqs.append(Seq(f"s{i}", tokens, sequence_features(ref.target, tokens, ref.layer_ids)[0].clone(), len(p)))
    return seqs


@torch.no_grad()
def drafts(ref: Reference, seq, anchors: torch.Tensor, block: int) -> torch.Tensor:
    """anchors [A] positions in seq -> the drafter's proposals [A, B-1] (dense reference forward)."""
    from sglang_dflash.train.blocks import block_hidden

    hidden, _ = block_hidden(ref.drafter, ref.embed, ref.mask_token_id, block, [(seq, anchors)])  # [A, B-1, H]
    return (hidden @ ref.head.t()).argmax(-1)


def offline_walk(
    ref: Reference, prompts: list[list[int]], outputs: list[list[int]], block: int, widths: list[int] | None = None
) -> list[dict]:
    """Per prompt: {"steps", "tau"} of greedy DFLASH serving over the target's greedy `outputs`
    (the anchor is the last committed token; accept the longest matching prefix + bonus).
    Like SGLang's meta_info, tau = output tokens / verify steps: the first output token comes
    from the prefill, not from a verify step. widths: the verify widths cycled per step."""
    from sglang_dflash.train.blocks import walk_counts

    counts = walk_counts(
        ref.drafter,
        ref.embed,
        ref.mask_token_id,
        block,
        sequences(ref, prompts, outputs),
        autocast=False,
        head=ref.head,
        widths=widths,
    )
    return [{"steps": b, "tau": len(o) / max(b, 1)} for (_, b), o in zip(counts, outputs)]


def train_drafter(
    target_path: str, out: str, *, block: int = BLOCK, layers: int = LAYERS, steps: int = STEPS, seed: int = SEED
) -> dict:
    """Train a drafter on the target's greedy answers to random prompts; write it (float32) to out."""
    from sglang_dflash.model.config import parse_drafter_config
    from sglang_dflash.model.drafter import DFlashDrafter
    from sglang_dflash.testing.tiny_drafter import make_tiny_drafter
    from sglang_dflash.train.blocks import block_hidden, sample_anchors
    from sglang_dflash.train.trainer import lr_factor

    t0 = time.time()
    torch.manual_seed(seed)
    # the checkpoint layout (mask token = last id, target_layer_ids spread over the tiny target)
    # comes from the random tiny drafter; only its weights are replaced by trained ones
    make_tiny_drafter(out, target_path, block_size=block, num_layers=layers, seed=seed)
    ref = load_reference(target_path, out)
    with open(os.path.join(out, "config.json")) as f:
        cdict = json.load(f)
    drafter = DFlashDrafter(parse_drafter_config(cdict, cdict["num_target_layers"]))
    for p in drafter.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    prompts = random_prompts(TRAIN_PROMPTS, seed=1000 + seed)
    seqs = sequences(ref, prompts, greedy(ref.target, prompts, ANSWER))
    t_data = time.time() - t0
    opt = torch.optim.AdamW(drafter.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    weights = torch.exp(-torch.arange(block - 1, dtype=torch.float32) / GAMMA)  # [B-1]
    drafter.train()
    for step in range(steps):
        picks = torch.randint(len(seqs), (SEQS,), generator=g).tolist()
        batch = sample_anchors([seqs[i] for i in picks], ANCHORS * SEQS, block, g)
        hidden, tgt = block_hidden(drafter, ref.embed, ref.mask_token_id, block, batch)  # [n, B-1, H], [n, B-1]
        logits = hidden @ ref.head.t()  # [n, B-1, V]
        ce = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none").view_as(tgt)
        w = weights[None, :] * (tgt >= 0)  # later block positions matter less: they need all earlier ones
        loss = (ce * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        for grp in opt.param_groups:
            grp["lr"] = LR * lr_factor(step, step / steps, warmup=30)
        opt.step()
    state = {k: v.detach().float().contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, os.path.join(out, "model.safetensors"))
    return {
        "steps": steps,
        "loss": round(loss.item(), 3),
        "data_s": round(t_data, 1),
        "train_s": round(time.time() - t0, 1),
    }


def make_context_pair(root: str) -> tuple[str, str]:
    """(target, drafter) paths, built once under root (also across processes) and reused."""

    def build(tmp: str) -> dict:
        target = make_target(str(tiny_model_cache(KIND, "float32", SEED)), os.path.join(tmp, "target"))
        info = train_drafter(target, os.path.join(tmp, "drafter"))
        with open(os.path.join(tmp, "train.json"), "w") as f:
            json.dump(info, f)
        return info

    d = os.path.join(str(root), f"context-{KIND}-s{SEED}-x{LAYER_SCALE}-b{BLOCK}-l{LAYERS}-{VERSION}")
    build_once(d, build)
    return os.path.join(d, "target"), os.path.join(d, "drafter")
