"""python -m sglang_dflash.offline: resume, bad lines, chat and raw prompts, equality with plain, a
clean exit (no traceback from multiprocessing's resource tracker), the embedded pair by default."""

import json
import os
import subprocess
import sys

import pytest

from sglang_dflash.cpu_serving import CPU_ENV

JOBS = [
    {"id": "raw-1", "prompt": "The water of"},
    {"id": "raw-2", "prompt": "a man"},
    {"id": "chat-1", "messages": [{"role": "user", "content": "call people"}]},
    {"id": "raw-3", "prompt": "their day", "sampling_params": {"max_new_tokens": 5}},
    {"id": "bad-temp", "prompt": "x", "sampling_params": {"temperature": -1}},
    {"prompt": "no id here"},
    {"id": "both", "prompt": "a", "messages": []},
]


def run(target, draft, inp, out, *extra):
    cmd = [
        sys.executable,
        "-m",
        "sglang_dflash.offline",
        "--model",
        target,
        "--input",
        str(inp),
        "--output",
        str(out),
        "--max-new-tokens",
        "16",
        "--batch-size",
        "3",
        "--dtype",
        "float32",
        *extra,
    ]
    pin = {}
    if draft:
        cmd += ["--draft", draft]
        pin = {"SGLANG_DFLASH_WIDTH": "16"}  # every step drafts (the controller may pick width 1 on a loaded host)
    p = subprocess.run(cmd, env={**os.environ, **CPU_ENV, **pin}, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "Traceback" not in p.stderr and "resource_tracker" not in p.stderr, p.stderr[-4000:]
    return p.stderr, [json.loads(line) for line in open(out)]


@pytest.mark.server
def test_offline_cli(pair, tmp_path):
    from sglang_dflash.testing.pairs import MIXED

    target, drafter = pair("llama", "float32", MIXED["llama"])
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(json.dumps(j) for j in JOBS) + "\n{not json\n")
    err, spec = run(target, drafter, inp, tmp_path / "spec.jsonl")
    assert "summary:" in err and "tau" in err
    by_id = {r["id"]: r for r in spec}
    assert len(spec) == len(by_id) == 8
    assert {k for k, r in by_id.items() if "error" in r} == {"bad-temp", "line-6", "both", "line-8"}
    assert by_id["raw-3"]["output_tokens"] == 5
    assert any(r.get("spec_accept_length", 0) > 1 for r in spec if "error" not in r)
    # plain decoding gives the same text for every good line
    _, plain = run(target, None, inp, tmp_path / "plain.jsonl")
    plain_by_id = {r["id"]: r for r in plain}
    for k, r in by_id.items():
        if "error" not in r:
            assert r["text"] == plain_by_id[k]["text"], k
    # resume: an interrupted output (first 3 lines kept) plus one new input line
    out = tmp_path / "resume.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in spec[:3]) + '{"id": "torn')
    with open(inp, "a") as f:
        f.write(json.dumps({"id": "raw-new", "prompt": "new day"}) + "\n")
    _, resumed = run(target, drafter, inp, out)
    ids = [r["id"] for r in resumed if isinstance(r, dict) and "id" in r]
    assert sorted(ids) == sorted(list(by_id) + ["raw-new"])


def resolved(monkeypatch, *argv):
    from sglang_dflash import embedded, offline

    monkeypatch.setattr(embedded, "derive", lambda: "EMBEDDED")
    a = offline.parse_args(["--input", "in.jsonl", "--output", "out.jsonl", *argv])
    offline.resolve_pair(a)
    return a.model, a.draft


def test_the_embedded_pair_is_the_default(monkeypatch):
    from sglang_dflash.drafters import shipped_drafter

    assert resolved(monkeypatch) == ("EMBEDDED", shipped_drafter())
    assert resolved(monkeypatch, "--draft", "D") == ("EMBEDDED", "D")
    assert resolved(monkeypatch, "--draft", "none") == ("EMBEDDED", None)
    assert resolved(monkeypatch, "--model", "M") == ("M", None)  # the shipped drafter fits only its target
    assert resolved(monkeypatch, "--model", "M", "--draft", "D") == ("M", "D")
