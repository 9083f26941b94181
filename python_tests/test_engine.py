"""The offline sglang.Engine serves DFLASH through our worker, losslessly (float32).

The verify width is pinned to the block: the 16 prompts run as one batch, and whether speculation
pays at batch 16 is the cost-aware controller's call from the host's measured step costs (on a
loaded 2-core host it chose width 1 for the whole batch, and nothing was drafted to check). The
controller's own choices are proven lossless by test_lossless.py (its adaptive and random-width
configurations)."""

import json
import os
import subprocess
import sys

import pytest

from sglang_dflash import env as dflash_env
from sglang_dflash.cpu_serving import CPU_ENV
from sglang_dflash.testing.servers import assert_lossless

HERE = os.path.dirname(__file__)


@pytest.mark.server
def test_offline_engine_lossless(pair, tmp_path):
    from sglang_dflash.testing.pairs import MIXED

    target, drafter = pair("qwen3", "float32", MIXED["qwen3"])
    out = tmp_path / "engine.json"
    env = {**os.environ, **CPU_ENV, "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env[dflash_env.WIDTH.name] = "16"  # the pair's block: every step drafts and verifies the whole block
    p = subprocess.run(
        [sys.executable, os.path.join(HERE, "engine_run.py"), target, drafter, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    res = json.loads(out.read_text())
    assert_lossless(res["refs"], res["outs"], 1e-4)
    taus = [o["tau"] for o in res["outs"]]
    print("engine taus", taus)
    assert all(t is not None and t >= 1 for t in taus) and max(taus) > 1.5
    tau = sum(o["tokens"] for o in res["outs"]) / sum(o["verify"] for o in res["outs"])
    assert tau > 1.2, f"the offline engine barely speculated: tau {tau:.2f}"
