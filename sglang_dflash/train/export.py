"""Stage 4: export the best checkpoint in the z-lab DFlash format the server loads, and verify it.

Writes OUT/config.json (architectures ["DFlashDraftModel"], model_type qwen3, block_size,
num_target_layers, dflash_config {mask_token_id, target_layer_ids}), OUT/model.safetensors (bf16)
and OUT/README.md (the card). Then reloads OUT through sglang_dflash.model.loader, checks it
against the target, and recomputes the held-out tau with the loaded weights.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from safetensors.torch import save_file


def write_checkpoint(out: str, config: dict, state: dict[str, torch.Tensor]) -> str:
    """config: z-lab config dict; state: DFlashDrafter state dict -> OUT folder (bf16 weights)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({**config, "torch_dtype": "bfloat16"}, f, indent=1)
    save_file(
        {k: (v if k == "d2t" else v.detach().to(torch.bfloat16)).contiguous() for k, v in state.items()},
        os.path.join(out, "model.safetensors"),
    )
    os.chmod(os.path.join(out, "model.safetensors"), 0o644)
    return out


def load_exported(out: str, model: str, dtype=torch.bfloat16):
    """The exported folder through the server's own loader and start-up checks."""
    from sglang_dflash.model.config import check_against_target, load_drafter_config
    from sglang_dflash.model.loader import load_drafter
    from sglang_dflash.model.mask_token import resolve_mask_token_id

    with open(os.path.join(model, "config.json")) as f:
        t = json.load(f)
    cfg = load_drafter_config(out, t["num_hidden_layers"])
    check_against_target(cfg, hidden_size=t["hidden_size"], vocab_size=t["vocab_size"])
    mask = resolve_mask_token_id(cfg, model, t["vocab_size"])
    return load_drafter(out, cfg, dtype, "cpu"), cfg, mask


def data_stats(workdir: str) -> dict:
    """Sizes of the sources: datagen's answers (data*.jsonl; those to corpus-asked prompts,
    `datagen --prompts corpus`, counted apart too) and the text documents that made it into the
    features (text.jsonl rows featurized before the deadline)."""
    from sglang_dflash.resumable_jsonl import read_rows
    from sglang_dflash.train.corpus import ASK_PREFIX
    from sglang_dflash.train.datagen import answer_files
    from sglang_dflash.train.features import done_ids

    featurized = done_ids(os.path.join(workdir, "features"))
    st = {"sequences": 0, "heldout": 0, "prompt_tokens": 0, "answer_tokens": 0, "families": {}}
    st.update(text_docs=0, text_tokens=0, ask_seqs=0, ask_tokens=0)
    for r in (r for f in answer_files(workdir) for r in read_rows(f)):
        if r["id"].startswith(ASK_PREFIX):
            st["ask_seqs"] += 1
            st["ask_tokens"] += len(r["answer_ids"])
        st["sequences"] += 1
        st["heldout"] += r["split"] == "heldout"
        st["prompt_tokens"] += len(r["prompt_ids"])
        st["answer_tokens"] += len(r["answer_ids"])
        st["families"][r["family"]] = st["families"].get(r["family"], 0) + 1
    for r in read_rows(os.path.join(workdir, "text.jsonl")):
        if r["id"] in featurized:
            st["text_docs"] += 1
            st["text_tokens"] += len(r["answer_ids"])
            st["families"][r["family"]] = st["families"].get(r["family"], 0) + 1
    return st


def extra_text(summ: dict) -> str:
    n = summ.get("train_seqs_by_workdir", {})
    return "; ".join(f"`{w}` ({n.get(w, 0)} sequences)" for w in summ["extra_features"])


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


def plot_curve(history: list[dict], path: str) -> None:
    """Held-out walk tau against labelled training tokens: the slope says what more training buys."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [h for h in history if "tokens" in h]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([h["tokens"] / 1e6 for h in rows], [h["tau"] for h in rows], marker="o")
    ax.set_xlabel("labelled block tokens trained on (millions)")
    ax.set_ylabel("held-out walk tau (first 128 tokens)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


CARD = """# smollm2-135m-instruct-dflash

A DFlash drafter (block size {block}, {layers} Qwen3-style layers, hidden {hidden}, {params:.2f}M
parameters, context from target layers {ids}, mask token id {mask}{vocab_note}) for the embedded
target SmolLM2-135M-Instruct (`sglang_dflash.embedded.derive()`), trained by `sglang_dflash/train`
on a 2-core CPU.

## Training data
Every source is ours (no public dataset, nothing downloaded):
- {seqs} prompts (seed {seed}; the run's) answered by the target itself with greedy decoding (at most {max_new} new tokens)
  through SGLang's offline Engine on CPU in bf16: {prompt_tok} prompt + {answer_tok} answer tokens.
  {templ} of them generated by `sglang_dflash/train/prompts.py` (templated arithmetic word problems,
  small coding tasks, general questions and 2-3 turn chats), {heldout} held out by hash (the
  held-out split every tau below is measured on); {ask_seqs} taken from the corpus documents' user
  turns (`datagen --prompts corpus`: implement a standard-library or site-packages
  function from its signature + docstring, continue a README or module docstring; {ask_tok} answer
  tokens, all train split).
- {text_docs} chat documents built from text installed on the machine (`sglang_dflash/train/corpus.py`:
  functions of the Python standard library and of the installed site-packages (`text-libcode`) to
  implement from signature + docstring, continuations of /usr/share/doc READMEs and module
  docstrings): {text_tok} assistant tokens labelled with the
  target's own argmax in one prefill per document (a block label counts only while the text
  follows the target's greedy chain, so every label is the token serving would verify).
Families: {families}.{extra}

## Training
Anchors sampled inside the answers, blocks [token_p, MASK x {bm1}], non-causal attention over the
anchor's own context features + its block, cross-entropy on the target's frozen tied LM head{head_note}
with weights exp(-(k-1)/{gamma}). {steps} steps ({anchors} anchors per step, bf16 autocast, AdamW,
{threads} threads), {train_min:.1f} min of training{rate}{warm}. Checkpoints ranked by the held-out walk tau.

## Result
Serving-equivalent held-out tau (walking each held-out answer the way greedy speculative decoding
does: the next block after the accepted tokens + bonus): {walk:.3f} over whole answers,
{walk128:.3f} over the first 128 answer tokens, with the weights reloaded from this folder through
`sglang_dflash.model.loader`. The per-anchor average (every answer position weighted equally, which
over-counts easy stretches): {tau_export:.3f} over {eval_n} anchors.

Draft vocabulary: {cut}

Learning curve (`learning_curve.png`: held-out walk tau over the first 128 tokens of {walk_seqs}
answers, against labelled block tokens trained on): {history}

## Reproduce
The whole pipeline, each stage resumable (corpus + datagen -> features -> train -> export):
```
python -m sglang_dflash.train all --workdir /work/train_run --deadline HH:MM
```
The command of this run:
```
{command}
```
"""

EXTRA_NOTE = "\n- Beside these, the train split of earlier runs whose features were reused (`--extra-features`): {}."

WARM_NOTE = (
    ", warm-started from `{}` (its weights; the draft vocabulary {}), so the steps,"
    " tokens and learning curve below add to that drafter's own"
)


def run(
    workdir: str,
    model: str,
    out: str,
    command: str = "",
    eval_anchors: int = 600,
    seed: int = 0,
    max_new_tokens: int = 224,
    draft_vocab: int = -1,
) -> dict:
    """draft_vocab: -1 chooses the reduced draft vocabulary by measured walk tau (vocab_cut.py), 0 keeps
    the full head, N > 0 cuts to the N most frequent labels (a drafter trained reduced keeps its own)."""
    from sglang_dflash.model.draft_vocab import d2t_from_ids, ids_from_d2t
    from sglang_dflash.train import vocab_cut
    from sglang_dflash.train.blocks import eval_tau, sample_anchors, walk_tau
    from sglang_dflash.train.features import load_seqs
    from sglang_dflash.train.trainer import load_embedding

    ck = torch.load(os.path.join(workdir, "ckpt", "best.pt"), weights_only=False)
    cfg, state = dict(ck["config"]), dict(ck["model"])
    write_checkpoint(out, cfg, state)
    drafter, dcfg, mask = load_exported(out, model)
    summ = {}
    sp = os.path.join(workdir, "train_summary.json")
    if os.path.exists(sp):
        with open(sp) as f:
            summ = json.load(f)
    train, held = load_seqs(workdir, summ.get("extra_features", ()))
    eval_set = sample_anchors(held, eval_anchors, dcfg.block_size, torch.Generator().manual_seed(1234), spread=True)
    embed = load_embedding(model)
    cut_rows = []
    if draft_vocab and not dcfg.draft_vocab_size:
        n, ids, cut_rows = vocab_cut.decide(drafter, embed, mask, dcfg.block_size, train, held, draft_vocab)
        if n:
            cfg["draft_vocab_size"], state["d2t"] = n, d2t_from_ids(ids)
            write_checkpoint(out, cfg, state)
            drafter, dcfg, mask = load_exported(out, model)
    del train
    dv = ids_from_d2t(drafter.d2t) if dcfg.draft_vocab_size else None
    tau = eval_tau(drafter, embed, mask, dcfg.block_size, eval_set, vocab=dv)
    walk = walk_tau(drafter, embed, mask, dcfg.block_size, held, vocab=dv)
    walk128 = walk_tau(drafter, embed, mask, dcfg.block_size, held, max_answer=128, vocab=dv)
    ds = data_stats(workdir)
    st = ck["state"]
    history = st.get("history", summ.get("history", []))
    history = list({h["step"]: h for h in history}.values())  # a resume re-evaluates its first step
    hist = ", ".join(f"{h.get('tokens', 0) / 1e6:.2f}M tokens (step {h['step']}): {h['tau']:.3f}" for h in history)
    plot_curve(history, os.path.join(out, "learning_curve.png"))
    n_vocab = dcfg.draft_vocab_size
    card = CARD.format(
        block=dcfg.block_size,
        layers=dcfg.num_layers,
        hidden=dcfg.hidden_size,
        ids=dcfg.target_layer_ids,
        params=sum(p.numel() for p in drafter.parameters()) / 1e6,
        mask=mask,
        seqs=ds["sequences"],
        templ=ds["sequences"] - ds["ask_seqs"],
        ask_seqs=ds["ask_seqs"],
        ask_tok=ds["ask_tokens"],
        seed=seed,
        families=ds["families"],
        max_new=max_new_tokens,
        prompt_tok=ds["prompt_tokens"],
        answer_tok=ds["answer_tokens"],
        heldout=ds["heldout"],
        bm1=dcfg.block_size - 1,
        gamma=summ.get("gamma", 7.0),
        steps=st["step"],
        anchors=summ.get("anchors_per_step", 128),
        train_min=st["train_s"] / 60,
        rate=f" ({summ['tok_s']:.0f} block tokens/s)" if summ.get("tok_s") else "",
        extra=EXTRA_NOTE.format(extra_text(summ)) if summ.get("extra_features") else "",
        warm=WARM_NOTE.format(summ["init_from"], "kept" if summ.get("keep_draft_vocab") else "re-chosen")
        if summ.get("init_from")
        else "",
        eval_n=sum(a.numel() for _, a in eval_set),
        vocab_note=f", reduced draft vocabulary of {n_vocab} tokens" if n_vocab else "",
        cut=cut_text(cut_rows, n_vocab),
        head_note=f" (its rows of the {n_vocab} most frequent labels, the d2t mapping)" if n_vocab else "",
        text_docs=ds["text_docs"],
        text_tok=ds["text_tokens"],
        threads=summ.get("threads", 1),
        walk_seqs=summ.get("walk_seqs", 40),
        tau_export=tau,
        walk=walk,
        walk128=walk128,
        history=hist or "n/a",
        command=summ.get("command") or command,
    )
    notes = os.path.join(workdir, "run_notes.md")  # free-form notes about this run, if any
    if os.path.exists(notes):
        with open(notes) as f:
            card += "\n## Run notes\n" + f.read()
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(card)
    res = {
        "out": out,
        "step": st["step"],
        "tau_train": ck["tau"],
        "tau_export": tau,
        "walk_tau": walk,
        "walk_tau_128": walk128,
        "vocab_cut": cut_rows,
        **ds,
    }
    print("export:", json.dumps(res), file=sys.stderr)
    return res
