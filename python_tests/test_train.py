"""The drafter training recipe (sglang_dflash/train), data side: prompts, the serving-equivalent
training forward, the fused head loss, features and labels, extra workdirs, deadlines, sharded datagen."""

import json
import os

import pytest
import torch

from sglang_dflash.pipeline.attention import TorchBlockAttention
from sglang_dflash.pipeline.block import build_block
from sglang_dflash.model.config import parse_drafter_config
from sglang_dflash.testing.reference import draft_block
from sglang_dflash.pipeline.context_kv import DraftKVCache
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.pipeline.context_kv import write_context
from sglang_dflash.testing.tiny_models import tiny_model_cache
from sglang_dflash.train import export, features, prompts, trainer
from sglang_dflash.train.blocks import Seq, block_hidden
from sglang_dflash.testing.tiny_config import tiny_cfg_dict


from train_helpers import _tiny_workdir, train_run  # noqa: F401


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


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_fused_head_loss_distils_to_the_targets_top_k(alpha):
    """With the target's top-k as soft targets (trainer --distil), the fused loss and gradient equal
    F.cross_entropy to the dense mix (1 - alpha) onehot + alpha p; a row without a distribution
    (sums to 0) keeps the hard label alone; top-k tokens the head lacks drop out, renormalised."""
    import torch.nn.functional as F

    from sglang_dflash.train.head_loss import head_cross_entropy, soft_rows

    g = torch.Generator().manual_seed(1)
    V, N, K = 300, 45, 6
    head = torch.randn(V, 16, generator=g) * 0.3
    h0 = torch.randn(N, 16, generator=g)
    tgt = torch.randint(0, V, (N,), generator=g)
    tgt[::7] = -100
    w = torch.exp(-(torch.arange(N) % 15) / 4.0)
    token_ids = torch.stack([torch.randperm(400, generator=g)[:K] for _ in range(N)]).int()  # some >= V
    token_ids[::4] = -1  # rows without a distribution
    logp = torch.randn(N, K, generator=g).log_softmax(-1) - 0.2  # top-k: less than all the mass
    remap = torch.full((400,), -100)
    remap[:V] = torch.arange(V)
    ids, p = soft_rows(token_ids, logp, remap)
    kept = (token_ids >= 0) & (token_ids < V)
    assert torch.allclose(p.sum(-1), kept.any(-1).float(), atol=1e-6) and (p[~kept] == 0).all()

    dense = torch.zeros(N, V).scatter_add_(1, ids, p)
    has = (p.sum(-1) > 0).float()[:, None]
    mix = (1 - alpha * has) * F.one_hot(tgt.clamp(min=0), V).float() + alpha * has * dense

    def ref(h):
        ce = F.cross_entropy(h @ head.t(), mix, reduction="none")
        m = w * (tgt >= 0)
        return (ce * m).sum() / m.sum()

    h1, h2 = h0.clone().requires_grad_(), h0.clone().requires_grad_()
    want, got = ref(h1), head_cross_entropy(h2, head, tgt, w, chunk=16, soft=(ids, p), alpha=alpha)
    want.backward(), got.backward()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(h2.grad, h1.grad, rtol=1e-5, atol=1e-6)
    plain = head_cross_entropy(h0, head, tgt, w, chunk=16)  # alpha 0 or no soft: the hard loss
    assert torch.equal(plain, head_cross_entropy(h0, head, tgt, w, chunk=16, soft=(ids, p), alpha=0.0))
    assert not torch.allclose(plain, got)


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
        train_run(wd, target, resume=False, no_text=no_text, **kw)
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
    train_run(str(new), target, resume=False, extra_features=[old], **kw)
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
