"""train/long_prompts.py: datagen prompts with a long context (a whole installed file or document,
then a question), from the corpus's sources only, deterministic, shardable like the others."""

from sglang_dflash.train import datagen
from sglang_dflash.train.long_prompts import CODE_QUESTIONS, TEXT_QUESTIONS, long_prompts


def test_long_prompts_are_long_distinct_and_end_with_a_question():
    ps = long_prompts(seed=1)
    assert len(ps) >= 200, "the corpus's sources should give hundreds of long prompts"
    assert len({p["id"] for p in ps}) == len(ps)
    assert {p["family"] for p in ps[:2]} == {"long-code", "long-prose"}  # families taken in turn
    for p in ps:
        (msg,) = p["messages"]
        body, question = msg["content"].rsplit("\n\n", 1)
        assert question in (CODE_QUESTIONS if p["family"] == "long-code" else TEXT_QUESTIONS)
        assert 1500 <= len(body) <= 4500 + 20  # the code fence
        assert "pydoc_data" not in body and p["split"] == "train" and p["id"].startswith("long-")
    assert [p["id"] for p in long_prompts(seed=1)] == [p["id"] for p in ps]
    assert [p["id"] for p in long_prompts(seed=2)] != [p["id"] for p in ps]


def test_datagen_shards_long_prompts():
    every = [p["id"] for p in long_prompts(seed=3)[:20]]
    parts = [[p["id"] for p in datagen.shard_prompts(20, 3, k, 2, set(), source="long")] for k in range(2)]
    assert sorted(parts[0] + parts[1]) == sorted(every) and parts[0] and parts[1]
