"""The data that trains a drafter: the machine's own corpus (ours, deterministic, train only), its
held-out documents kept out of datagen, train all's datagen threads and reused runs, the unseen set."""

import json
import os
from collections import Counter

import pytest
import torch


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
    assert seen["env"]["SGLANG_DFLASH_CPU_THREADS"] == "1"  # its scheduler too (cpu/cpu_threads.py)


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
