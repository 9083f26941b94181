"""train/followup_prompts.py: a second turn after an earlier datagen's own answers (multi-turn data
no template wrote), from the earlier run's train split and complete answers only."""

import json

import pytest

from sglang_dflash.train import datagen
from sglang_dflash.train import followup_prompts as followup_prompts_module
from sglang_dflash.train.followup_prompts import CODE_FOLLOWUPS, PROSE_FOLLOWUPS, followup_prompts
from sglang_dflash.train.prompts import generate

CODE = "```python\nprint(1)\n```"


def decode(ids):
    """A stand-in tokenizer: an answer starting with token 1 holds a code fence."""
    return CODE if ids[0] == 1 else "Plain words, " + " ".join(map(str, ids))


def answers(seed=5, n=40):
    rows = []
    for i, p in enumerate(generate(n, seed)):
        rows.append(
            {
                "id": p["id"],
                "family": p["family"],
                "split": p["split"],
                "answer_ids": [1 if i % 3 == 0 else 2] + [7] * (40 if i % 7 else 4),  # every 7th too short
                "finish": "length" if i % 5 == 4 else "stop",
            }
        )
    return rows


def test_a_followup_is_the_earlier_conversation_its_answer_and_a_question():
    rows = answers()
    got = followup_prompts(rows, 5, decode)
    want = [r for r in rows if r["split"] == "train" and r["finish"] == "stop" and len(r["answer_ids"]) >= 16]
    assert [g["id"] for g in got] == ["followup-" + r["id"] for r in want] and len(got) >= 15
    first = {p["id"]: p for p in generate(40, 5)}
    for g, r in zip(got, want):
        *earlier, answer, question = g["messages"]
        assert earlier == first[r["id"]]["messages"]  # the earlier prompt, as its source gives it
        assert answer == {"role": "assistant", "content": decode(r["answer_ids"])}
        assert question["role"] == "user"
        assert question["content"] in (CODE_FOLLOWUPS if answer["content"] == CODE else PROSE_FOLLOWUPS)
        assert g["split"] == "train" and g["family"] == "followup-" + r["family"]
    assert followup_prompts(rows, 5, decode) == got  # deterministic


def test_the_wrong_seed_is_refused_by_name():
    with pytest.raises(ValueError, match="pass the earlier run's --seed"):
        followup_prompts(answers(seed=5), 6, decode)


def test_datagen_shards_followups_of_an_earlier_workdir(tmp_path, monkeypatch):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    rows = answers()
    # a long prompt's id is its text's hash (found at any seed); a stand-in source spares the file scan
    longs = [
        {
            "id": f"long-{i:016x}",
            "family": "long-code",
            "split": "train",
            "messages": [{"role": "user", "content": f"doc {i}"}],
        }
        for i in range(3)
    ]
    monkeypatch.setattr(followup_prompts_module, "long_prompts", lambda seed: longs)
    rows += [{"id": p["id"], "family": p["family"], "split": "train", "answer_ids": [2] * 20, "finish": "stop"}
             for p in longs]  # fmt: skip
    with open(earlier / "data.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows[:20])
    with open(earlier / "data.1.jsonl", "w") as f:  # a second shard's file is read too
        f.writelines(json.dumps(r) + "\n" for r in rows[20:])
    every = [p["id"] for p in followup_prompts(rows, 5, decode)]
    assert {"followup-" + p["id"] for p in longs} <= set(every)
    parts = [
        [
            p["id"]
            for p in datagen.shard_prompts(999, 5, k, 2, set(), "followup", followup_of=str(earlier), decode=decode)
        ]
        for k in range(2)
    ]
    assert sorted(parts[0] + parts[1]) == sorted(every) and parts[0] and parts[1]
    with pytest.raises(ValueError, match="needs --followup-of"):
        datagen.shard_prompts(10, 5, 0, 1, set(), "followup", decode=decode)
    with pytest.raises(ValueError, match="no datagen answers there"):
        datagen.shard_prompts(10, 5, 0, 1, set(), "followup", followup_of=str(tmp_path / "none"), decode=decode)
