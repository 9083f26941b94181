"""Each bad drafter checkpoint fails the real server at start-up with a message naming the field."""

import json
import os
import shutil

import pytest
from safetensors.torch import load_file, save_file

from sglang_dflash.testing.servers import run_failing
from sglang_dflash.testing.tiny_drafter import make_tiny_drafter


def edit_config(d, fn):
    p = os.path.join(d, "config.json")
    with open(p) as f:
        cfg = json.load(f)
    fn(cfg)
    with open(p, "w") as f:
        json.dump(cfg, f)


def edit_weights(d, fn):
    p = os.path.join(d, "model.safetensors")
    w = load_file(p)
    fn(w)
    save_file(w, p)


def other_hidden(target, tmp):
    t = os.path.join(tmp, "t32")
    os.makedirs(t)
    with open(os.path.join(target, "config.json")) as f:
        cfg = json.load(f)
    cfg["hidden_size"] = 32
    with open(os.path.join(t, "config.json"), "w") as f:
        json.dump(cfg, f)
    return t


CASES = {
    "hidden_size": (lambda d, t, tmp: make_tiny_drafter(d, other_hidden(t, tmp)), "hidden_size"),
    "head_layout": (lambda d, t, tmp: edit_config(d, lambda c: c.update(num_key_value_heads=3)), "head layout"),
    "missing_weight": (
        lambda d, t, tmp: edit_weights(d, lambda w: w.pop("layers.1.mlp.up_proj.weight")),
        "missing weights",
    ),
    "extra_weight": (
        lambda d, t, tmp: edit_weights(d, lambda w: w.update({"lm_head.weight": w["fc.weight"].clone()})),
        "unexpected weights",
    ),
    "layer_ids": (
        lambda d, t, tmp: edit_config(d, lambda c: c["dflash_config"].update(target_layer_ids=[1, 7])),
        "target_layer_ids",
    ),
    "no_mask": (lambda d, t, tmp: edit_config(d, lambda c: c["dflash_config"].pop("mask_token_id")), "mask token"),
    "mask_not_in_vocab": (
        lambda d, t, tmp: edit_config(
            d, lambda c: (c["dflash_config"].pop("mask_token_id"), c.update(mask_token="<|no-such|>"))
        ),
        "not in the target vocabulary",
    ),
    "block_too_small": (lambda d, t, tmp: edit_config(d, lambda c: c.update(block_size=1)), "block_size"),
    "block_too_large": (lambda d, t, tmp: edit_config(d, lambda c: c.update(block_size=999)), "block_size"),
    "vocab": (lambda d, t, tmp: edit_config(d, lambda c: c.update(vocab_size=1000)), "vocab_size"),
}


@pytest.mark.server
@pytest.mark.parametrize("case", list(CASES))
def test_bad_checkpoint_fails_at_startup(pair, tmp_path, case):
    target, good = pair("llama", "float32", None)
    d = str(tmp_path / "drafter")
    shutil.copytree(good, d)
    make, message = CASES[case]
    make(d, target, str(tmp_path))
    code, out = run_failing(target, d)
    assert code != 0, out[-3000:]
    errors = [line for line in out.splitlines() if "Error: " in line and message in line]
    assert errors, out[-3000:]
    print(case, "->", errors[-1][-240:])


@pytest.mark.server
def test_a_grammar_backend_without_rollback_fails_at_startup(pair):
    target, drafter = pair("llama", "float32", None)
    code, out = run_failing(target, drafter, extra=["--grammar-backend", "outlines"])
    assert code != 0 and "--grammar-backend xgrammar" in out, out[-3000:]


def test_a_failing_attention_warm_up_stops_the_server_at_startup(pair, monkeypatch):
    """The drafter attention's start-up warm-up (FlashInfer on GPU, torch here) failing is a start-up
    error through the real server, not a per-step fallback (fault injected)."""
    target, drafter = pair("llama", "float32", None, block=4)
    monkeypatch.setenv("SGLANG_DFLASH_DEBUG_FAIL_WARMUP", "1")
    code, out = run_failing(target, drafter)
    assert code != 0 and "failed its start-up warm-up" in out and "injected warm-up failure" in out, out[-3000:]
