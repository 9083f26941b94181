"""bench/checks/gpu_check.sh --dry-run: the GPU check's one-go script on CPU (the kernels tier, then the
loop tier's CPU twin: tiny Llama and Qwen3 targets, graphs eager, torch attention), so a lent GPU
cannot fail it on a Python error. The loop tier needs no SGLang, and it fails when acceptance is wrong."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = os.path.join(ROOT, "bench", "checks")


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_dry_run_passes_every_row(tmp_path):
    p = subprocess.run(
        ["bash", "bench/checks/gpu_check.sh", "--dry-run", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert p.returncode == 0 and "gpu_check: PASS" in p.stdout, (p.stdout + p.stderr)[-4000:]
    with open(tmp_path / "gpu_check_kernels_cpu.json") as f:
        assert json.load(f)["ok"]
    got = rows(tmp_path / "loop_check_cpu.jsonl")
    sys.path.insert(0, CHECKS)
    import loop_check

    plan = loop_check.PLANS["dry"]
    assert all(r["ok"] for r in got), [r for r in got if not r["ok"]]
    for preset in plan["presets"]:
        mine = [r for r in got if r["preset"] == preset]
        loops = [r for r in mine if r["check"] == "loop"]
        assert [r["bs"] for r in loops] == plan["batches"] and all(r["identical"] for r in loops)
        assert sum(r["tokens"] for r in loops) == plan["max_new"] * sum(plan["batches"])
        assert max(r["tau"] for r in loops) > 1.2, loops  # drafts were accepted, not only bonus tokens
        assert all(r["steer_token_share"] < 0.95 for r in loops), (
            loops
        )  # not one token repeated: identity means something
        shapes = {(r["bs"], r["width"]) for r in mine if r["check"] == "shape"}
        assert shapes == {(b, w) for b in plan["buckets"] for w in plan["widths"]}
        (summary,) = [r for r in mine if r["check"] == "summary"]
        assert summary["graphs_mode"] == "eager" and summary["attention"] == "torch"
        assert summary["shapes_held"] == len(shapes) and summary["counts"]["replayed"] > len(shapes), summary


def test_loop_tier_imports_no_sglang():
    code = (
        "import sys\n"
        "for m in ('sglang', 'sgl_kernel', 'flashinfer'):\n"
        "    sys.modules[m] = None\n"
        "import loop_check, spec_loop, hf_target\n"
        "bad = [m for m in sys.modules if m.startswith('sglang_dflash.srt')]\n"
        "assert not bad, bad\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=CHECKS, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.fixture
def tiny():
    sys.path.insert(0, CHECKS)
    import loop_check
    import spec_loop
    import torch

    plan = loop_check.PLANS["dry"]
    t = loop_check.Target("llama-tiny", "cpu")
    g = torch.Generator().manual_seed(0)
    t.steer([torch.randint(3, t.vocab - 1, (10,), generator=g).tolist() for _ in range(3)], plan["max_new"])
    d = spec_loop.Drafting(t, loop_check.DRAFTERS["llama-tiny"], plan["block"], 64, 4, plan["buckets"])
    return loop_check, spec_loop, plan, d


def test_the_loop_row_fails_when_acceptance_is_wrong(monkeypatch, tiny):
    """Acceptance that takes every draft (the target's tokens replaced by the drafts, shifted): the
    outputs hold the drafter's tokens, so the row is not identical and not ok. The same row with
    the real acceptance is identical (the control)."""
    import torch

    loop_check, spec_loop, plan, d = tiny
    good = loop_check.loop_row(d, plan, 3, torch.Generator().manual_seed(5))
    assert good["ok"] and good["identical"], good
    real = spec_loop.accept_block

    def accept_all(draft, target, *rest):  # draft, target [bs, W]
        return real(draft, torch.cat([draft[:, 1:], target[:, -1:]], dim=1), *rest)

    monkeypatch.setattr(spec_loop, "accept_block", accept_all)
    bad = loop_check.loop_row(d, plan, 3, torch.Generator().manual_seed(5))
    assert not bad["identical"] and not bad["ok"], bad
