"""Tiny DFlash drafter checkpoints (z-lab format) for tests, plus "steered" target/drafter pairs.

A steered pair makes acceptance controllable without training: one residual channel `e` carries a
constant from the embedding to the final norm (every layer's output projections write zero into
it), and the LM head reads channel `e` only for token STEER_TOKEN. The drafter always proposes
STEER_TOKEN; the target proposes it at every position when `strength` is large (forced
acceptance) and only part of the time when `strength` is moderate (mixed acceptance lengths).
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

from sglang_dflash.model.config import default_target_layer_ids

STEER_TOKEN = 42
STEER_CHANNEL = 0
STEER_VALUE = 10.0


def make_tiny_drafter(
    path: str,
    target_path: str,
    *,
    block_size: int = 16,
    num_layers: int = 2,
    target_layer_ids: list[int] | None = None,
    seed: int = 0,
    std: float = 0.02,
    mask_token_id: int | None = None,
    mask_token: str | None = None,
    steer: bool = False,
    extra_config: dict | None = None,
    dflash2: dict | None = None,
    draft_vocab: int = 0,
) -> str:
    """dflash2: e.g. {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8,
    "selector_top_k": 4} makes a DFlash 2 checkpoint (convolutions + candidate selector).
    draft_vocab N > 0: a reduced draft vocabulary of N random target ids (STEER_TOKEN among them),
    as config draft_vocab_size + weight d2t (model/draft_vocab.py)."""
    with open(os.path.join(target_path, "config.json")) as f:
        t = json.load(f)
    h, heads, kv = t["hidden_size"], t["num_attention_heads"], t["num_key_value_heads"]
    d = t.get("head_dim") or h // heads
    inter, vocab, L = t["intermediate_size"], t["vocab_size"], t["num_hidden_layers"]
    ids = target_layer_ids
    if ids is None:  # z-lab's default collapses on a 4-layer target; spread over [1, L-2] then
        ids = default_target_layer_ids(L, num_layers)
        if len(set(ids)) < len(ids):
            ids = sorted({1 + round(i * (L - 3) / max(num_layers - 1, 1)) for i in range(num_layers)})
    dflash = {"target_layer_ids": ids}
    dflash.update(dflash2 or {})
    if mask_token is None:
        dflash["mask_token_id"] = vocab - 1 if mask_token_id is None else mask_token_id
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": h,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": d,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": t.get("rope_theta", 10000.0),
        "max_position_embeddings": 4096,
        "block_size": block_size,
        "num_target_layers": L,
        "dflash_config": dflash,
        "torch_dtype": "float32",
    }
    if mask_token is not None:
        cfg["mask_token"] = mask_token
    cfg.update(extra_config or {})
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g) * std  # noqa: E731
    w = {"fc.weight": rnd(h, len(ids) * h), "hidden_norm.weight": torch.ones(h), "norm.weight": torch.ones(h)}
    for i in range(num_layers):
        p = f"layers.{i}."
        w.update(
            {
                p + "input_layernorm.weight": torch.ones(h),
                p + "post_attention_layernorm.weight": torch.ones(h),
                p + "self_attn.q_proj.weight": rnd(heads * d, h),
                p + "self_attn.k_proj.weight": rnd(kv * d, h),
                p + "self_attn.v_proj.weight": rnd(kv * d, h),
                p + "self_attn.o_proj.weight": rnd(h, heads * d),
                p + "self_attn.q_norm.weight": torch.ones(d),
                p + "self_attn.k_norm.weight": torch.ones(d),
                p + "mlp.gate_proj.weight": rnd(inter, h),
                p + "mlp.up_proj.weight": rnd(inter, h),
                p + "mlp.down_proj.weight": rnd(h, inter),
            }
        )
        if steer:
            w[p + "self_attn.o_proj.weight"][STEER_CHANNEL] = 0
            w[p + "mlp.down_proj.weight"][STEER_CHANNEL] = 0
    if dflash2:
        w.update(_dflash2_weights(dflash2, h, vocab, num_layers, rnd))
    if draft_vocab:
        others = torch.randperm(vocab, generator=g)
        keep = torch.cat([torch.tensor([STEER_TOKEN]), others[others != STEER_TOKEN][: draft_vocab - 1]]).sort().values
        cfg["draft_vocab_size"] = draft_vocab
        w["d2t"] = keep - torch.arange(draft_vocab)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file({k: v.contiguous() for k, v in w.items()}, os.path.join(path, "model.safetensors"))
    return path


def _dflash2_weights(d2: dict, h: int, vocab: int, num_layers: int, rnd) -> dict:
    """Small random DFlash 2 weights around the identity convolution, so a steered pair keeps its
    acceptance while every conv tap and selector term is exercised."""
    taps, groups, r = d2["conv_kernel_size"], h // d2["conv_group_size"], d2["selector_rank"]
    w = {}
    for i in range(num_layers):
        for conv in ("attention_conv", "mlp_conv"):
            base = rnd(2, taps, h) * 5
            base[:, 0] += 1.0
            w[f"layers.{i}.{conv}.base_kernel"] = base
            w[f"layers.{i}.{conv}.kernel_projection.weight"] = rnd(2 * taps * groups, h)
    w["candidate_selector.hidden_projection.weight"] = rnd(r, h) * 10
    w["candidate_selector.predecessor_codebook"] = rnd(vocab, r) * 10
    w["candidate_selector.successor_codebook"] = rnd(vocab, r) * 10
    return w


WRITES_RESIDUAL = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


@torch.no_grad()
def wire_steering(weights: dict, head: torch.Tensor, strength: float) -> None:
    """In place on a Llama/Qwen-style target's weights by HF/SGLang name; head: its (untied) LM head."""
    weights["model.embed_tokens.weight"][:, STEER_CHANNEL] = STEER_VALUE  # the channel every position carries ...
    for name, p in weights.items():
        if name.endswith(WRITES_RESIDUAL):
            p[STEER_CHANNEL] = 0  # ... that no layer writes into ...
    weights["model.norm.weight"][STEER_CHANNEL] = 1.0  # ... survives the final norm (dummy norms are ~1e-3) ...
    head[:, STEER_CHANNEL] = 0
    head[STEER_TOKEN, STEER_CHANNEL] = strength  # ... and is read by the steer token's logit only


def steer_target(src: str, dst: str, strength: float) -> str:
    """Copy HF checkpoint `src` to `dst` with the steering channel wired in (untied LM head)."""
    import shutil

    shutil.copytree(src, dst, dirs_exist_ok=True)
    f = os.path.join(dst, "model.safetensors")
    w = load_file(f)
    w["lm_head.weight"] = w.get("lm_head.weight", w["model.embed_tokens.weight"]).clone()
    wire_steering(w, w["lm_head.weight"], strength)
    save_file({k: v.contiguous() for k, v in w.items()}, f)
    cfg_f = os.path.join(dst, "config.json")
    with open(cfg_f) as fh:
        cfg = json.load(fh)
    cfg["tie_word_embeddings"] = False
    with open(cfg_f, "w") as fh:
        json.dump(cfg, fh, indent=1)
    return dst
