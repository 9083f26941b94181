"""A reduced draft vocabulary (model/draft_vocab.py, EAGLE-3's d2t convention) and the data that
trains a drafter: text-document labels cut at the first off-chain token, the machine's own corpus."""

import dataclasses
import json
import os
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from sglang_dflash.model.config import DrafterConfigError, check_against_target, load_drafter_config
from sglang_dflash.model.config import parse_drafter_config
from sglang_dflash.model.draft_vocab import coverage, d2t_from_ids, ids_from_d2t, most_frequent
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.model.loader import load_drafter
from sglang_dflash.pipeline.draft import propose, sample_drafts
from sglang_dflash.testing.tiny_config import tiny_cfg_dict
from sglang_dflash.testing.tiny_drafter import STEER_TOKEN, make_tiny_drafter
from sglang_dflash.testing.tiny_models import tiny_model_cache
from sglang_dflash.train.blocks import Seq, block_inputs

V, N, B = 50, 12, 6


def _drafters():
    """The same weights twice: scoring all V tokens, and scoring N of them through d2t."""
    torch.manual_seed(0)
    full = DFlashDrafter(parse_drafter_config(tiny_cfg_dict(block_size=B), 4)).eval()
    for p in full.parameters():
        torch.nn.init.normal_(p, std=0.3)
    cut = DFlashDrafter(parse_drafter_config(tiny_cfg_dict(block_size=B, draft_vocab_size=N), 4)).eval()
    cut.load_state_dict(full.state_dict(), strict=False)
    ids = torch.randperm(V)[:N].sort().values
    cut.d2t.copy_(d2t_from_ids(ids))
    return full, cut, ids


def _attend(layer, q, k, v):
    """Non-causal attention inside each block (no context): enough to exercise the head."""
    n = q.shape[0] // B
    q, k, v = (t.view(n, B, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2).reshape(n * B, -1, q.shape[-1])


def test_reduced_head_logits_equal_full_head_on_kept_tokens():
    full, cut, ids = _drafters()
    emb = torch.randn(V, 32)
    block = torch.full((3, B), 49)
    block[:, 0] = torch.tensor([3, 17, 30])
    pos = torch.arange(B).repeat(3, 1) + 5
    seen = {}
    head_full = lambda h: seen.setdefault("full", h @ emb.t())  # noqa: E731
    head_cut = lambda h: seen.setdefault("cut", h @ emb[ids].t())  # noqa: E731
    want = propose(full, _attend, lambda t: emb[t], head_full, block, pos).tokens
    got = propose(cut, _attend, lambda t: emb[t], head_cut, block, pos).tokens
    torch.testing.assert_close(seen["cut"], seen["full"][:, ids])
    assert torch.equal(got[:, 1:].reshape(-1), ids[seen["full"][:, ids].argmax(-1)])
    assert torch.isin(got[:, 1:], ids).all() and torch.equal(got[:, 0], block[:, 0])
    inside = torch.isin(want[:, 1:], ids)  # where the full argmax is a kept token, both agree
    assert torch.equal(got[:, 1:][inside], want[:, 1:][inside])
    # sampled DFlash 1 drafts map their candidates the same way
    logits = seen["cut"].view(3, B - 1, N)
    prop = sample_drafts(block.clone(), logits, torch.ones(3), B - 1, torch.zeros(3, B - 1, 32), cut.to_target)
    assert torch.isin(prop.cand_ids, ids).all() and torch.isin(prop.tokens[:, 1:], ids).all()


def test_d2t_helpers():
    ids = torch.tensor([2, 5, 9, 40])
    assert torch.equal(ids_from_d2t(d2t_from_ids(ids)), ids)
    counts = torch.tensor([0, 5, 5, 1, 9, 0])
    assert most_frequent(counts, 3).tolist() == [1, 2, 4] and coverage(counts, torch.tensor([1, 2, 4])) == 19 / 20


@pytest.fixture(scope="module")
def target():
    return str(tiny_model_cache("llama", "float32"))


def test_checkpoint_with_d2t_loads_and_bad_mappings_fail(target, tmp_path):
    path = make_tiny_drafter(str(tmp_path / "ok"), target, block_size=4, draft_vocab=40)
    cfg = load_drafter_config(path, 4)
    check_against_target(cfg, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size)
    m = load_drafter(path, cfg, torch.bfloat16, "cpu")
    saved = load_file(os.path.join(path, "model.safetensors"))
    assert m.d2t.dtype == torch.int64 and torch.equal(m.d2t, saved["d2t"])
    kept = ids_from_d2t(m.d2t)
    assert STEER_TOKEN in kept.tolist() and torch.equal(m.to_target(torch.arange(40)), kept)
    save_file({**saved, "t2d": torch.zeros(cfg.vocab_size, dtype=torch.bool)}, os.path.join(path, "model.safetensors"))
    load_drafter(path, cfg, torch.float32, "cpu")  # EAGLE-3's t2d beside d2t is accepted
    plain = make_tiny_drafter(str(tmp_path / "plain"), target, block_size=4)
    assert not hasattr(load_drafter(plain, load_drafter_config(plain, 4), torch.float32, "cpu"), "d2t")
    bad = {
        "range": saved["d2t"] + cfg.vocab_size,
        "twice": torch.zeros(40, dtype=torch.int64) - torch.arange(40),
        "float": saved["d2t"].float(),
        "shape": saved["d2t"][:30],
    }
    for name, d2t in bad.items():
        save_file({**saved, "d2t": d2t}, os.path.join(path, "model.safetensors"))
        with pytest.raises(DrafterConfigError, match="d2t"):
            load_drafter(path, cfg, torch.float32, "cpu")
    too_big = dataclasses.replace(cfg, draft_vocab_size=cfg.vocab_size + 1)
    with pytest.raises(DrafterConfigError, match="draft_vocab_size"):
        check_against_target(too_big, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size)


def test_text_labels_stop_at_the_first_off_chain_token():
    """Row j's label is the target's greedy token after p+j-1, kept only while the text between
    the anchor and it is the target's own greedy chain (what serving verifies after j-1 accepts)."""
    tokens = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
    labels = torch.tensor([-100, 3, 4, 9, 6, 7, 8, 11])  # the target would write 9 after 4, not 5
    seq = Seq("t", tokens, torch.zeros(8, 4), 1, labels)
    _, _, tgt = block_inputs(seq, torch.tensor([1, 4, 6]), 4, 0)
    assert tgt.tolist() == [[3, 4, 9], [6, 7, 8], [8, 11, -100]]
    answer = Seq("a", tokens, torch.zeros(8, 4), 1)  # the target's own answer: every next token counts
    _, _, tgt = block_inputs(answer, torch.tensor([1, 5]), 4, 0)
    assert tgt.tolist() == [[3, 4, 5], [7, 8, -100]]


def test_features_label_text_with_the_targets_argmax(target):
    from sglang_dflash.train.features import load_target, sequence_features

    model = load_target(target, torch.float32)
    tokens = torch.randint(3, 300, (20,), generator=torch.Generator().manual_seed(0))
    feats, labels, soft = sequence_features(model, tokens, [1, 2], label_from=8, topk=5, topk_from=6)
    with torch.no_grad():
        logits = model(input_ids=tokens[None]).logits[0].float()
    want = logits.argmax(-1)
    assert (labels[:8] == -100).all() and torch.equal(labels[8:], want[8:])
    assert feats.shape == (20, 2 * model.config.hidden_size)
    # the distillation targets: the target's own top 5 and their log-probabilities, answer part only
    ids, logp = soft
    ref_logp, ref_ids = logits.log_softmax(-1).topk(5, dim=-1)
    assert (ids[:6] == -1).all() and torch.isinf(logp[:6]).all()
    assert torch.equal(ids[6:].long(), ref_ids[6:]) and torch.allclose(logp[6:], ref_logp[6:], atol=1e-5)
    assert torch.equal(ids[8:, 0].long(), labels[8:])  # the hard label is the top-1
    _, nxt, none = sequence_features(model, tokens, [1, 2])
    assert torch.equal(nxt[:-1], tokens[1:]) and nxt[-1] == -100 and none is None


def test_corpus_is_ours_deterministic_and_train_only():
    from sglang_dflash.train import corpus, prompts

    docs = corpus.documents(seed=0)
    assert [d["id"] for d in docs[:50]] == [d["id"] for d in corpus.documents(seed=0)[:50]]
    assert len(docs) > 2000 and len({d["id"] for d in docs}) == len(docs)
    assert {d["family"] for d in docs} == {"text-code", "text-prose", "text-libcode"}
    # library code comes after the stdlib + prose documents, whose order it leaves unchanged
    base = corpus.documents(seed=0, lib=False)
    assert [d["id"] for d in docs[: len(base)]] == [d["id"] for d in base]
    assert {d["family"] for d in docs[len(base) :]} == {"text-libcode"} and len(docs) - len(base) > 2000
    assert not any(corpus._BENCH_NAMES.search(m["content"]) for d in docs for m in d["messages"])
    rels = [f.split("site-packages" + os.sep)[1] for f in corpus._lib_files()]
    assert not any(set(r.split(os.sep)) & corpus._LIB_SKIP for r in rels)
    per = Counter(r.split(os.sep)[0] for r in rels)
    assert len(per) > 50 and max(per.values()) == corpus.LIB_FILES_PER_PACKAGE
    assert all(d["split"] == "train" and [m["role"] for m in d["messages"]] == ["user", "assistant"] for d in docs)
    held = {p["messages"][-1]["content"] for p in prompts.generate(3000) if p["split"] == "heldout"}
    assert not held & {d["messages"][0]["content"] for d in docs}


def test_held_out_documents_stay_out_of_the_corpus(tmp_path):
    """`train --exclude-docs` (bench/unseen_set.py's rows): their source documents never enter
    text.jsonl, so no run featurizes or trains on the unseen held-out set; a resumed run neither."""
    from sglang_dflash.resumable_jsonl import read_rows
    from sglang_dflash.train import corpus
    from sglang_dflash.train.__main__ import main

    docs = corpus.documents(seed=0)
    held = tmp_path / "unseen.jsonl"
    held.write_text("".join(json.dumps({"id": "unseen-" + d["id"], "source": d["id"]}) + "\n" for d in docs[5:8]))
    work = str(tmp_path / "w")
    for _ in range(2):
        main(["corpus", "--workdir", work, "--exclude-docs", str(held), "--threads", str(torch.get_num_threads())])
        ids = [r["id"] for r in read_rows(os.path.join(work, "text.jsonl"))]
        assert ids == [d["id"] for d in docs[:5] + docs[8:]]


def test_corpus_prompts_for_datagen_leave_held_out_documents_out(monkeypatch, tmp_path):
    """`datagen --prompts corpus`: the corpus documents' user turns as prompts, families in turn,
    sharded disjointly; an --exclude-docs document (and any twin asking the same) is never asked."""
    from sglang_dflash.train import corpus, datagen
    from sglang_dflash.train.__main__ import main

    def doc(i, fam, user):
        msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": f"answer {i}"}]
        return {"id": f"text-{i:04d}", "family": f"text-{fam}", "split": "train", "messages": msgs}

    docs = [doc(i, "code", f"implement f{i}") for i in range(20)] + [
        doc(20 + i, "prose", f"go on {i}") for i in range(6)
    ]
    docs += [doc(40 + i, "libcode", f"lib {i}") for i in range(10)]
    docs += [doc(90, "libcode", "implement f3"), doc(91, "code", "implement f5")]  # twins of a held / a kept doc
    monkeypatch.setattr(corpus, "documents", lambda seed=0, lib=True: list(docs))
    held = {"text-0003", "text-0041"}
    asks = corpus.ask_prompts(0, held)
    assert [p["id"] for p in asks] == [p["id"] for p in corpus.ask_prompts(0, held)]
    assert [p["id"] for p in asks] != [p["id"] for p in corpus.ask_prompts(1, held)]
    users = [p["messages"][0]["content"] for p in asks]
    assert len(set(users)) == len(users) == 38 - 2 - 2  # held out: 2, their twin: 1, a repeated user turn: 1
    assert "implement f3" not in users and "lib 1" not in users and "implement f5" in users
    assert [p["family"] for p in asks[:18]] == ["ask-code", "ask-libcode", "ask-prose"] * 6
    assert all(p["split"] == "train" and [m["role"] for m in p["messages"]] == ["user"] for p in asks)
    assert all(p["id"].startswith(corpus.ASK_PREFIX) and not p["id"].startswith(corpus.ID_PREFIX) for p in asks)
    parts = [datagen.shard_prompts(30, 0, k, 2, set(), "corpus", held) for k in range(2)]
    assert sorted(p["id"] for part in parts for p in part) == sorted(p["id"] for p in asks[:30])
    assert not {p["id"] for p in parts[0]} & {p["id"] for p in parts[1]}
    with pytest.raises(ValueError, match="--prompts"):
        datagen.shard_prompts(5, 0, 0, 1, set(), "benchmarks")
    rows = tmp_path / "unseen.jsonl"
    rows.write_text("".join(json.dumps({"id": "unseen-" + i, "source": i}) + "\n" for i in sorted(held)))
    seen = {}
    monkeypatch.setattr(datagen, "run", lambda *a, **k: seen.update(k))
    argv = ["datagen", "--workdir", str(tmp_path / "w"), "--model", "M", "--prompts", "corpus"]
    main(argv + ["--exclude-docs", str(rows), "--threads", str(torch.get_num_threads())])
    assert seen["source"] == "corpus" and seen["exclude"] == held
    from sglang_dflash.train import export

    (tmp_path / "w" / "data.jsonl").write_text(
        "".join(
            json.dumps({"id": i, "split": "train", "family": "f", "prompt_ids": [1], "answer_ids": [2] * n}) + "\n"
            for i, n in (("p0", 3), (asks[0]["id"], 5))
        )
    )
    st = export.data_stats(str(tmp_path / "w"))  # the card counts the corpus-asked answers apart
    assert (st["sequences"], st["answer_tokens"], st["ask_seqs"], st["ask_tokens"]) == (2, 8, 1, 5)


def test_train_all_gives_datagen_one_thread(monkeypatch, tmp_path):
    """`train all` runs datagen (SGLang's Engine) beside the features on the other core: with the
    caller's OMP_NUM_THREADS=2 inherited, spinning threads cut datagen to a third."""
    import subprocess

    from sglang_dflash.train import export, features, trainer
    from sglang_dflash.train.__main__ import main

    seen = {}

    class Proc:
        pid = None

        def __init__(self, argv, env=None):
            seen["argv"], seen["env"] = argv, env

        def wait(self):
            return 0

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(subprocess, "Popen", Proc)
    for mod, fn in ((features, "run"), (trainer, "run"), (export, "run")):
        monkeypatch.setattr(mod, fn, lambda *a, **k: {})
    main(["all", "--workdir", str(tmp_path), "--no-text", "--model", "M", "--threads", str(torch.get_num_threads())])
    assert "datagen" in seen["argv"] and seen["env"]["OMP_NUM_THREADS"] == "1"
    assert seen["env"]["SGLANG_DFLASH_CPU_THREADS"] == "1"  # its scheduler too (srt/cpu_threads.py)


def test_unseen_set_skips_every_parents_documents(tmp_path):
    """bench/unseen_set.py picks documents no run of a warm-start chain featurized: those in any
    --from workdir's shards and the first N of corpus.documents(S) for --seen-prefix S:N."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import unseen_set
    from sglang_dflash.train import corpus

    docs = corpus.documents(seed=0)[:30]
    wd = tmp_path / "w"
    (wd / "features").mkdir(parents=True)
    rows = [{"id": d["id"], "family": d["family"]} for d in docs]
    (wd / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    torch.save({"ids": [docs[10]["id"], "p0"]}, wd / "features" / "shard_00000.pt")
    got = {r["id"] for r in unseen_set.pick([str(wd)], per_family=100, seen_prefix=["0:5"])}
    assert got == {d["id"] for d in docs[5:10] + docs[11:]}


def test_train_all_skips_reused_runs_documents(monkeypatch, tmp_path):
    """`train all --extra-features W0`: documents W0 already featurized (content-hashed ids) are not
    featurized again; its answers' ids ("p<N>", not content) do not stop this run's answers."""
    import subprocess

    from sglang_dflash.train import export, features, trainer
    from sglang_dflash.train.__main__ import main

    old = tmp_path / "old"
    (old / "features").mkdir(parents=True)
    torch.save({"ids": ["text-00aa", "p0"]}, old / "features" / "shard_00000.pt")
    seen = {}

    class Proc:
        pid = None

        def __init__(self, argv, env=None):
            pass

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Proc)
    monkeypatch.setattr(features, "run", lambda *a, **k: seen.update(k) or {})
    monkeypatch.setattr(trainer, "run", lambda c: seen.update(trainer=c) or {})
    monkeypatch.setattr(export, "run", lambda *a, **k: {})
    argv = ["all", "--workdir", str(tmp_path / "w"), "--no-text", "--model", "M", "--extra-features", str(old)]
    main(argv + ["--threads", str(torch.get_num_threads())])
    assert seen["skip"] == {"text-00aa"} and list(seen["trainer"].extra_features) == [str(old)]
