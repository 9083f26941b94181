"""Training runs end to end on a tiny target: overfit and export round trip (full and reduced
vocabulary, warm starts), and `train mix`."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from sglang_dflash.model.config import DrafterConfigError
from sglang_dflash.model.draft_vocab import d2t_from_ids
from sglang_dflash.testing.tiny_models import tiny_model_cache
from sglang_dflash.train import export, features
from sglang_dflash.model.checkpoint import load_exported, write_checkpoint


from train_helpers import _tiny_workdir, train_run


def test_tiny_overfit_and_export_round_trip(tmp_path):
    torch.set_num_threads(1)
    target = str(tiny_model_cache("llama", "float32"))
    wd = _tiny_workdir(tmp_path)
    st = features.run(wd, target, num_context_layers=1, shard_size=5, dtype=torch.float32)
    assert st["sequences"] == 12
    assert features.run(wd, target, num_context_layers=1, shard_size=5)["sequences"] == 0  # resumable
    out = train_run(
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
    loaded, _, mask = load_exported(str(tmp_path / "drafter"), target)
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
    out = train_run(
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
    loaded, _, _ = load_exported(str(tmp_path / "drafter"), target)
    assert torch.equal(loaded.d2t, saved["d2t"])
    assert abs(res["walk_tau_128"] - res["tau_train"]) < 0.35 and res["walk_tau_128"] > 1.5, res
    assert os.path.exists(tmp_path / "drafter" / "learning_curve.png")
    # warm start (--init-from): zero steps from the exported weights walk as well as they do (d2t
    # is re-chosen from the run's labels, not copied); from scratch the same zero steps walk ~1
    kw = dict(num_layers=1, steps=0, ckpt_minutes=100, resume=False, eval_anchors=40, command="t", draft_vocab=16)
    cold = train_run(wd, target, block_size=4, **kw)["best_tau"]
    warm = train_run(wd, target, block_size=4, init_from=str(tmp_path / "drafter"), **kw)["best_tau"]
    assert cold < 1.3 and abs(warm - res["walk_tau_128"]) < 0.1, (cold, warm, res)
    # the warm start is checkpointed before any step: a run that only makes it worse exports it
    ruin = train_run(wd, target, block_size=4, init_from=str(tmp_path / "drafter"), **{**kw, "steps": 5}, lr=30.0)
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
    kept = train_run(wd, target, block_size=4, init_from=str(tmp_path / "odd"), **kw, keep_draft_vocab=True)
    assert kept["best_tau"] < warm  # its argmax can only land on 40..55: the odd vocabulary is in use
    export.run(wd, target, str(tmp_path / "kept"), command="t", eval_anchors=40)
    assert torch.equal(load_file(str(tmp_path / "kept" / "model.safetensors"))["d2t"], d2t_from_ids(odd))
    assert "(its weights; the draft vocabulary kept)" in (tmp_path / "kept" / "README.md").read_text()
    full_cfg = json.loads((tmp_path / "drafter" / "config.json").read_text())
    full_cfg.pop("draft_vocab_size")
    write_checkpoint(str(tmp_path / "full"), full_cfg, {k: v for k, v in parent.items() if k != "d2t"})
    with pytest.raises(DrafterConfigError, match="no reduced draft vocabulary"):
        train_run(wd, target, block_size=4, init_from=str(tmp_path / "full"), **kw, keep_draft_vocab=True)
    with pytest.raises(DrafterConfigError, match="block_size is 4, this run's is 8"):
        train_run(wd, target, block_size=8, init_from=str(tmp_path / "drafter"), **kw)


def test_tiny_distillation_training(tmp_path):
    """--distil: the features stage stores the target's top-k per answer position (ids -1 before),
    the trainer mixes it with the hard label over a reduced vocabulary (top-k tokens outside it
    dropped) and still learns the answers; features without a top-k are refused by name."""
    import glob

    torch.set_num_threads(1)
    target = str(tiny_model_cache("llama", "float32"))
    wd = _tiny_workdir(tmp_path)
    features.run(wd, target, num_context_layers=1, shard_size=6, dtype=torch.float32, topk=8)
    shard = torch.load(sorted(glob.glob(os.path.join(wd, "features", "shard_*.pt")))[0])
    assert shard["topk_ids"].shape == (shard["tokens"].shape[0], 8) and shard["topk_ids"].dtype == torch.int32
    first, end = int(shard["answer_start"][0]), int(shard["offsets"][1])  # the shard's first sequence
    assert (shard["topk_ids"][:first] == -1).all() and (shard["topk_ids"][first:end] >= 0).all()
    kw = dict(num_layers=1, block_size=4, lr=1e-2, anchors=8, seqs=4, ckpt_minutes=100, resume=False)
    kw.update(eval_anchors=40, command="test", draft_vocab=16)
    out = train_run(wd, target, steps=200, distil=0.5, **kw)
    assert out["loss_last"] < 0.5 * out["loss_first"] and out["best_tau"] > 1.5, out
    with open(os.path.join(wd, "train_summary.json")) as f:
        assert json.load(f)["distil"] == 0.5
    (tmp_path / "bare").mkdir()
    bare = _tiny_workdir(tmp_path / "bare")
    features.run(bare, target, num_context_layers=1, shard_size=6, dtype=torch.float32, topk=0)
    with pytest.raises(ValueError, match="--distil needs features with the target's top-k"):
        train_run(bare, target, steps=2, distil=0.5, **kw)


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
