"""The drafter training recipe (sglang_dflash/train): prompts, serving-equivalent training forward,
a tiny overfit run through features -> trainer -> export, and the export round trip."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from sglang_dflash.pipeline.attention import TorchBlockAttention
from sglang_dflash.pipeline.block import build_block
from sglang_dflash.model.config import DrafterConfigError, parse_drafter_config
from sglang_dflash.testing.reference import draft_block
from sglang_dflash.pipeline.context_kv import DraftKVCache
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.draft_vocab import d2t_from_ids
from sglang_dflash.pipeline.context_kv import write_context
from sglang_dflash.testing.tiny_models import tiny_model_cache
from sglang_dflash.train import export, features, prompts, trainer
from sglang_dflash.train.blocks import Seq, block_hidden
from sglang_dflash.train.export import write_checkpoint
from sglang_dflash.testing.tiny_config import tiny_cfg_dict


def test_prompts_deterministic_and_split_disjoint():
    a, b = prompts.generate(400, seed=3), prompts.generate(400, seed=3)
    assert a == b and prompts.generate(150, seed=3) == a[:150]
    assert prompts.generate(50, seed=4) != a[:50]
    assert {p["family"] for p in a} == {"arithmetic", "coding", "general", "chat"}
    assert all(p["messages"][-1]["role"] == "user" for p in a)
    texts = [json.dumps(p["messages"], sort_keys=True) for p in a]
    assert len(set(texts)) == len(texts)
    held = {t for t, p in zip(texts, a) if p["split"] == "heldout"}
    train = {t for t, p in zip(texts, a) if p["split"] == "train"}
    assert held and train and not held & train
    assert 0.01 < len(held) / len(a) < 0.12
    # the split is a function of the conversation, whatever seed produced it
    assert all(prompts.split_of(p["messages"]) == p["split"] for p in prompts.generate(100, seed=9))


def _tiny_drafter(block: int):
    cfg = parse_drafter_config(tiny_cfg_dict(block_size=block, rope_theta=1e4), 4)
    torch.manual_seed(0)
    model = DFlashDrafter(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return model


def test_training_forward_equals_serving_per_anchor():
    """The batched, masked training forward gives, for every anchor, the logits the serving path
    (write_context -> build_block -> TorchBlockAttention -> draft_block) gives for that anchor."""
    B = 6
    model = _tiny_drafter(B)
    emb = torch.randn(50, 32)
    g = torch.Generator().manual_seed(1)
    seqs = [
        Seq(f"s{i}", torch.randint(0, 49, (n,), generator=g), torch.randn(n, 64, generator=g), 4)
        for i, n in enumerate([14, 21])
    ]
    batch = [(seqs[0], torch.tensor([4, 7, 12])), (seqs[1], torch.tensor([5, 6, 15, 19]))]
    with torch.no_grad():
        hidden, targets = block_hidden(model, emb, 49, B, batch)  # [7, B-1, H], [7, B-1]
    train_logits = hidden @ emb.t()
    row = 0
    for seq, anchors in batch:
        for p in anchors.tolist():
            cache = DraftKVCache(2, 64, 2, 8, torch.float32, "cpu")
            slots = torch.randperm(64, generator=g)
            ctx_slots, blk_slots = slots[:p], slots[p : p + B]
            write_context(model, cache, seq.feats[:p], torch.arange(p), ctx_slots)
            ids, pos = build_block(seq.tokens[p : p + 1], torch.tensor([p]), B, 49)
            attend = TorchBlockAttention(cache.k, cache.v, [torch.cat([ctx_slots, blk_slots])], blk_slots, 8**-0.5)
            seen = []
            draft_block(model, attend, lambda t: emb[t], lambda h: seen.append(h @ emb.t()) or seen[-1], ids, pos)
            torch.testing.assert_close(train_logits[row], seen[0], atol=1e-4, rtol=1e-4)
            want = [seq.tokens[p + k].item() if p + k < len(seq.tokens) else -100 for k in range(1, B)]
            assert targets[row].tolist() == want
            row += 1
    assert row == hidden.shape[0]


def _tiny_workdir(tmp_path):
    """A data.jsonl of 12 cyclic answers (learnable from the anchor token), one held out."""
    wd = tmp_path / "run"
    wd.mkdir()
    with open(wd / "data.jsonl", "w") as f:
        for i in range(12):
            ans = [10 + (i + k) % 20 for k in range(40)] + [2]
            f.write(
                json.dumps(
                    {
                        "id": f"p{i}",
                        "family": "arithmetic",
                        "split": "heldout" if i == 0 else "train",
                        "prompt_ids": [1, 5 + i, 6, 7],
                        "answer_ids": ans,
                    }
                )
                + "\n"
            )
    return str(wd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_head_loss_equals_weighted_cross_entropy(dtype):
    """head_loss.head_cross_entropy (the trainer's loss, fused and chunked) gives the loss and the
    hidden-state gradient of the unfused recipe: weighted F.cross_entropy over the logits of a frozen
    head, -100 targets skipped, row counts not a multiple of the chunk."""
    import torch.nn.functional as F

    from sglang_dflash.train.head_loss import head_cross_entropy

    g = torch.Generator().manual_seed(0)
    head = (torch.randn(300, 24, generator=g) * 0.3).to(dtype)
    h0 = torch.randn(77, 24, generator=g)
    tgt = torch.randint(0, 300, (77,), generator=g)
    tgt[::5] = -100
    w = torch.exp(-(torch.arange(77) % 15) / 4.0)

    def ref(h):
        ce = F.cross_entropy((h.to(dtype) @ head.t()).float(), tgt, reduction="none")
        m = w * (tgt >= 0)
        return (ce * m).sum() / m.sum()

    h1, h2 = h0.clone().requires_grad_(), h0.clone().requires_grad_()
    want, got = ref(h1), head_cross_entropy(h2, head, tgt, w, chunk=16)
    want.backward(), got.backward()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    assert torch.allclose(h2.grad, h1.grad, rtol=tol, atol=tol * float(h1.grad.abs().max()))
    assert float((h2.grad - h1.grad).abs().max()) < 0.1 * float(h1.grad.abs().max())


def test_tiny_overfit_and_export_round_trip(tmp_path):
    torch.set_num_threads(1)
    target = str(tiny_model_cache("llama", "float32"))
    wd = _tiny_workdir(tmp_path)
    st = features.run(wd, target, num_context_layers=1, shard_size=5, dtype=torch.float32)
    assert st["sequences"] == 12
    assert features.run(wd, target, num_context_layers=1, shard_size=5)["sequences"] == 0  # resumable
    out = trainer.run(
        wd,
        target,
        num_layers=1,
        block_size=4,
        steps=200,
        lr=1e-2,
        anchors=8,
        seqs=4,
        ckpt_minutes=100,
        resume=False,
        eval_anchors=40,
        command="test",
    )
    assert out["steps"] == 200 and out["loss_last"] < 0.5 * out["loss_first"], out
    assert out["best_tau"] > 1.5, out
    res = export.run(wd, target, str(tmp_path / "drafter"), command="test", eval_anchors=40)
    with open(tmp_path / "drafter" / "config.json") as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 4 and cfg["num_target_layers"] == 4
    assert cfg["dflash_config"]["target_layer_ids"] == [2]
    best = torch.load(os.path.join(wd, "ckpt", "best.pt"), weights_only=False)
    saved = load_file(str(tmp_path / "drafter" / "model.safetensors"))
    assert set(saved) == set(best["model"]) and all(v.dtype == torch.bfloat16 for v in saved.values())
    loaded, _, mask = export.load_exported(str(tmp_path / "drafter"), target)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, best["model"][k].to(torch.bfloat16)), k
    assert mask == cfg["dflash_config"]["mask_token_id"]
    assert abs(res["walk_tau_128"] - res["tau_train"]) < 0.35, res  # both walk the held-out answers
    assert 1.0 <= res["walk_tau"] <= 4.0 and 1.0 <= res["walk_tau_128"] <= 4.0, res
    # the same weights cut to the 21 labels of the answers (+ nothing else): same argmax, same tau
    cut = export.run(wd, target, str(tmp_path / "cut"), command="test", eval_anchors=40, draft_vocab=21)
    assert load_file(str(tmp_path / "cut" / "model.safetensors"))["d2t"].shape == (21,)
    assert [r["draft_vocab"] for r in cut["vocab_cut"]] == [384, 21] and cut["vocab_cut"][1]["coverage"] == 1.0
    assert abs(cut["walk_tau_128"] - cut["vocab_cut"][1]["walk_tau_128"]) < 1e-3, cut  # reloaded with d2t
    assert cut["walk_tau_128"] >= res["walk_tau_128"] - 1e-3, cut  # every label is kept: nothing lost
    # an already exported drafter cut afterwards (train cut): the same mapping, the card extended
    from sglang_dflash.train import vocab_cut

    again = vocab_cut.cut_checkpoint(str(tmp_path / "drafter"), wd, target, str(tmp_path / "cut2"), 21)
    assert again["draft_vocab"] == 21 and again["rows"] == cut["vocab_cut"]
    d2t = load_file(str(tmp_path / "cut2" / "model.safetensors"))["d2t"]
    assert torch.equal(d2t, load_file(str(tmp_path / "cut" / "model.safetensors"))["d2t"])
    assert "## Draft vocabulary (cut after training)" in (tmp_path / "cut2" / "README.md").read_text()
    assert "Reproduce" in (tmp_path / "drafter" / "README.md").read_text()


def test_tiny_reduced_vocab_training_and_export(tmp_path):
    """draft_vocab N: the softmax covers the N most frequent labels, the export carries d2t (int64)
    and the reloaded drafter maps its argmax back to target ids (walk tau as good as at training)."""
    torch.set_num_threads(1)
    target = str(tiny_model_cache("llama", "float32"))
    wd = _tiny_workdir(tmp_path)
    features.run(wd, target, num_context_layers=1, shard_size=5, dtype=torch.float32)
    out = trainer.run(
        wd, target, num_layers=1, block_size=4, steps=200, lr=1e-2, anchors=8, seqs=4,
        ckpt_minutes=100, resume=False, eval_anchors=40, command="test", draft_vocab=16,
    )  # fmt: skip
    assert out["best_tau"] > 1.5, out
    res = export.run(wd, target, str(tmp_path / "drafter"), command="test", eval_anchors=40)
    with open(tmp_path / "drafter" / "config.json") as f:
        assert json.load(f)["draft_vocab_size"] == 16
    saved = load_file(str(tmp_path / "drafter" / "model.safetensors"))
    assert saved["d2t"].dtype == torch.int64 and saved["d2t"].shape == (16,)
    kept = (saved["d2t"] + torch.arange(16)).tolist()
    assert set(kept) <= set(range(10, 30)) | {2}  # the most frequent labels of the answers
    loaded, _, _ = export.load_exported(str(tmp_path / "drafter"), target)
    assert torch.equal(loaded.d2t, saved["d2t"])
    assert abs(res["walk_tau_128"] - res["tau_train"]) < 0.35 and res["walk_tau_128"] > 1.5, res
    assert os.path.exists(tmp_path / "drafter" / "learning_curve.png")
    # warm start (--init-from): zero steps from the exported weights walk as well as they do (d2t
    # is re-chosen from the run's labels, not copied); from scratch the same zero steps walk ~1
    kw = dict(num_layers=1, steps=0, ckpt_minutes=100, resume=False, eval_anchors=40, command="t", draft_vocab=16)
    cold = trainer.run(wd, target, block_size=4, **kw)["best_tau"]
    warm = trainer.run(wd, target, block_size=4, init_from=str(tmp_path / "drafter"), **kw)["best_tau"]
    assert cold < 1.3 and abs(warm - res["walk_tau_128"]) < 0.1, (cold, warm, res)
    # the warm start is checkpointed before any step: a run that only makes it worse exports it
    ruin = trainer.run(wd, target, block_size=4, init_from=str(tmp_path / "drafter"), **{**kw, "steps": 5}, lr=30.0)
    with open(os.path.join(wd, "train_summary.json")) as f:
        hist = json.load(f)["history"]
    assert [h["step"] for h in hist] == [0, 5] and ruin["best_tau"] == warm and hist[1]["tau"] < warm, hist
    export.run(wd, target, str(tmp_path / "warm"), command="t", eval_anchors=40, seed=5)
    card = (tmp_path / "warm" / "README.md").read_text()
    assert (
        "(seed 5;" in card
        and f"warm-started from `{tmp_path / 'drafter'}` (its weights; the draft vocabulary re-chosen)" in card
    )
    # --keep-draft-vocab: the parent's vocabulary, not this run's most frequent labels (a parent
    # whose d2t is not this run's top 16), into the checkpoint and the export; no d2t: an error by name
    parent = load_file(str(tmp_path / "drafter" / "model.safetensors"))
    odd = torch.tensor(sorted(set(range(40, 56)) | {2}))[:16]
    write_checkpoint(str(tmp_path / "odd"), json.loads((tmp_path / "drafter" / "config.json").read_text()),
                     {**parent, "d2t": d2t_from_ids(odd)})  # fmt: skip
    kept = trainer.run(wd, target, block_size=4, init_from=str(tmp_path / "odd"), **kw, keep_draft_vocab=True)
    assert kept["best_tau"] < warm  # its argmax can only land on 40..55: the odd vocabulary is in use
    export.run(wd, target, str(tmp_path / "kept"), command="t", eval_anchors=40)
    assert torch.equal(load_file(str(tmp_path / "kept" / "model.safetensors"))["d2t"], d2t_from_ids(odd))
    assert "(its weights; the draft vocabulary kept)" in (tmp_path / "kept" / "README.md").read_text()
    full_cfg = json.loads((tmp_path / "drafter" / "config.json").read_text())
    full_cfg.pop("draft_vocab_size")
    write_checkpoint(str(tmp_path / "full"), full_cfg, {k: v for k, v in parent.items() if k != "d2t"})
    with pytest.raises(DrafterConfigError, match="no reduced draft vocabulary"):
        trainer.run(wd, target, block_size=4, init_from=str(tmp_path / "full"), **kw, keep_draft_vocab=True)
    with pytest.raises(DrafterConfigError, match="block_size is 4, this run's is 8"):
        trainer.run(wd, target, block_size=8, init_from=str(tmp_path / "drafter"), **kw)


def test_features_take_answers_first_and_label_text_with_the_argmax(tmp_path):
    """Answers (the target's own tokens) are featurized before text documents, and a text
    document's labels are the target's argmax over its answer part (-100 before it)."""
    torch.set_num_threads(1)
    target = str(tiny_model_cache("llama", "float32"))
    wd = _tiny_workdir(tmp_path)
    g = torch.Generator().manual_seed(0)
    with open(os.path.join(wd, "text.jsonl"), "w") as f:
        for i in range(4):
            ans = torch.randint(3, 300, (12,), generator=g).tolist()
            row = {
                "id": f"text-{i}",
                "family": "text-code",
                "split": "train",
                "prompt_ids": [1, 9, 9],
                "labels": "argmax",
            }
            f.write(json.dumps({**row, "answer_ids": ans}) + "\n")
    features.run(wd, target, num_context_layers=1, shard_size=5, dtype=torch.float32)
    shards = [torch.load(os.path.join(wd, "features", f"shard_{i:05d}.pt")) for i in range(4)]
    order = [sid for s in shards for sid in s["ids"]]
    assert order[:12] == [f"p{i}" for i in range(12)] and sorted(order[12:]) == [f"text-{i}" for i in range(4)]
    train, _ = trainer.load_seqs(wd)
    model = features.load_target(target, torch.float32)
    for s in train:
        if s.id.startswith("text-"):
            with torch.no_grad():
                want = model(input_ids=s.tokens[None]).logits[0].argmax(-1)
            assert (s.labels[:3] == -100).all() and torch.equal(s.labels[3:], want[3:])
        else:
            assert torch.equal(s.labels[:-1], s.tokens[1:])
    # --no-text trains on the answers alone (the label-source comparison's answers-only arm)
    kw = dict(num_layers=1, block_size=4, steps=2, anchors=2, seqs=2, ckpt_minutes=100, eval_anchors=8, command="t")
    for no_text, want in ((False, len(train)), (True, sum(not s.id.startswith("text-") for s in train))):
        trainer.run(wd, target, resume=False, no_text=no_text, **kw)
        with open(os.path.join(wd, "train_summary.json")) as f:
            assert json.load(f)["train_seqs"] == want == (len(train) - 4 if no_text else len(train))


def test_extra_features_add_earlier_runs_train_split_only(tmp_path):
    """--extra-features W0: W0's train split is trained on beside the run's own, its held-out split
    is not (the run's curve stays on its own held-out prompts), a sequence met twice counts once, and
    features of other target layers are refused by name."""
    torch.set_num_threads(1)
    target = str(tiny_model_cache("llama", "float32"))
    (tmp_path / "a").mkdir()
    old = _tiny_workdir(tmp_path / "a")  # p0 held out, p1..p11 train
    new = tmp_path / "run"
    new.mkdir()
    with open(new / "data.jsonl", "w") as f:
        rows = [([1, 6, 6, 7], [10 + (1 + k) % 20 for k in range(40)] + [2], "train")]  # = old p1
        rows += [([1, 40 + i, 6, 7], [12 + (3 * i + k) % 17 for k in range(30)] + [2], "train") for i in range(4)]
        rows += [([1, 60, 6, 7], [11 + k % 9 for k in range(30)] + [2], "heldout")]
        for i, (p, a, split) in enumerate(rows):
            row = {"id": f"p{i}", "family": "arithmetic", "split": split, "prompt_ids": p, "answer_ids": a}
            f.write(json.dumps(row) + "\n")
    features.run(old, target, num_context_layers=1, shard_size=5, dtype=torch.float32)
    features.run(str(new), target, num_context_layers=1, shard_size=5, dtype=torch.float32, skip={"p4"})
    assert "p4" not in features.done_ids(str(new / "features"))  # reused documents are not redone
    per: dict = {}
    train, held = features.load_seqs(str(new), [old], per)
    assert len(train) == 4 + 10 and per == {str(new): 4, old: 10}, per
    assert [s.tokens[1].item() for s in held] == [60]  # the new run's own held-out only
    kw = dict(num_layers=1, block_size=4, steps=2, anchors=2, seqs=2, ckpt_minutes=100, eval_anchors=8, command="t")
    trainer.run(str(new), target, resume=False, extra_features=[old], **kw)
    with open(new / "train_summary.json") as f:
        summ = json.load(f)
    assert summ["train_seqs"] == 14 and summ["extra_features"] == [old], summ
    export.run(str(new), target, str(tmp_path / "drafter"), command="t", eval_anchors=8, draft_vocab=0)
    assert f"`{old}` (10 sequences)" in (tmp_path / "drafter" / "README.md").read_text()
    meta = os.path.join(old, "features", "meta.json")
    with open(meta) as f:
        m = json.load(f)
    with open(meta, "w") as f:
        json.dump({**m, "target_layer_ids": [0, 1]}, f)
    with pytest.raises(ValueError, match=r"--extra-features .*target layers \[0, 1\]"):
        features.load_seqs(str(new), [old])


def test_deadline_is_the_next_such_time():
    import datetime as dt

    from sglang_dflash.train.__main__ import parse_deadline

    now = dt.datetime(2026, 11, 30, 23, 50, tzinfo=dt.timezone.utc)
    assert parse_deadline("01:15", now) - now.timestamp() == 85 * 60  # after midnight: tomorrow
    assert parse_deadline("23:59", now) - now.timestamp() == 9 * 60
    assert parse_deadline(None) is None


def test_sharded_datagen_splits_prompts_and_features_read_every_shard(monkeypatch, tmp_path):
    """--datagen-procs N: N datagen processes answer disjoint shards that cover the prompts, each into
    its own file, waited for before the features; the features and the card read every shard's file."""
    import subprocess

    from sglang_dflash.train import datagen
    from sglang_dflash.train.__main__ import main

    every = [p["id"] for p in prompts.generate(50, 3)]
    parts = [[p["id"] for p in datagen.shard_prompts(50, 3, k, 3, set())] for k in range(3)]
    assert sorted(sum(parts, [])) == sorted(every) and all(parts) and len(set(sum(parts, []))) == 50
    assert every[4] not in [p["id"] for p in datagen.shard_prompts(50, 3, 1, 3, {every[4]})]
    for name, rid in (("data.jsonl", "p0"), ("data.1.jsonl", "p1"), ("data.10.jsonl", "p3"), ("text.jsonl", "t")):
        with open(tmp_path / name, "w") as f:
            f.write(
                json.dumps({"id": rid, "split": "train", "family": "f", "prompt_ids": [1], "answer_ids": [2]}) + "\n"
            )
    assert [r["id"] for r in features.read_new(str(tmp_path), {"p0"})] == ["p1", "p3", "t"]
    assert export.data_stats(str(tmp_path))["sequences"] == 3
    spawned, seen = [], {}

    class Proc:
        pid = 4242

        def __init__(self, argv, env=None):
            spawned.append(argv)

        def wait(self):
            seen["waited"] = seen.get("waited", 0) + 1
            return 0

    monkeypatch.setattr(subprocess, "Popen", Proc)
    monkeypatch.setattr(features, "run", lambda *a, **k: seen.update(k, waited_before=seen.get("waited")) or {})
    monkeypatch.setattr(trainer, "run", lambda *a, **k: {})
    monkeypatch.setattr(export, "run", lambda *a, **k: {})
    main(["all", "--workdir", str(tmp_path / "w"), "--no-text", "--model", "M", "--datagen-procs", "2"])
    shards = [(a[a.index("--shard") + 1], a[a.index("--shards") + 1]) for a in spawned]
    assert shards == [("0", "2"), ("1", "2")] and seen["waited_before"] == 2 and seen["follow_pid"] is None


def test_mix_interpolates_one_chains_drafters(tmp_path):
    """train mix: (1 - w) x parent + w x child, tensor by tensor, d2t copied (never averaged), the
    child's config beside it; drafters with different draft vocabularies are refused by name."""
    from safetensors.torch import save_file

    from sglang_dflash.train.__main__ import main
    from sglang_dflash.train.interpolate import interpolate

    d2t = torch.tensor([5, 5, 7])
    for name, val in (("parent", 1.0), ("child", 3.0), ("other", 3.0)):
        (tmp_path / name).mkdir()
        other = d2t + (name == "other")
        save_file(
            {"w": torch.full((2, 3), val, dtype=torch.bfloat16), "d2t": other},
            str(tmp_path / name / "model.safetensors"),
        )
        (tmp_path / name / "config.json").write_text(json.dumps({"who": name}))
    mixed = interpolate(str(tmp_path / "parent"), str(tmp_path / "child"), str(tmp_path / "m"), 0.75)
    saved = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert torch.equal(saved["w"], torch.full((2, 3), 2.5, dtype=torch.bfloat16)) and torch.equal(saved["d2t"], d2t)
    assert (
        torch.equal(mixed["w"], saved["w"])
        and json.loads((tmp_path / "m" / "config.json").read_text())["who"] == "child"
    )
    argv = ["mix", "--drafter", str(tmp_path / "parent"), "--init-from", str(tmp_path / "child"), "--model", "M"]
    main(argv + ["--mix-weight", "0.25", "--out", str(tmp_path / "cli")])
    assert float(load_file(str(tmp_path / "cli" / "model.safetensors"))["w"][0, 0]) == 1.5
    with pytest.raises(DrafterConfigError, match="'d2t' differs"):
        interpolate(str(tmp_path / "parent"), str(tmp_path / "other"), str(tmp_path / "bad"), 0.5)
    with pytest.raises(ValueError, match="--mix-weight 1.5"):
        interpolate(str(tmp_path / "parent"), str(tmp_path / "child"), str(tmp_path / "bad"), 1.5)
