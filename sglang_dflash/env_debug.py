"""The debug, fault-injection and test switches and internal state: `SGLANG_DFLASH_*` variables no
server needs. Reached as `env.X` (sglang_dflash/env.py re-exports them); `python -m sglang_dflash.env
--all` lists them."""

from __future__ import annotations

from sglang_dflash.env import DEBUG, INTERNAL, EnvVar

# ---- debugging and fault injection -----------------------------------------------------------
DEBUG_DUMP_DIR = EnvVar(
    "SGLANG_DFLASH_DEBUG_DUMP_DIR",
    str,
    None,
    "debug: save each request's drafter context K/V after prefill here",
    level=DEBUG,
)
DEBUG_FAIL_DRAFT_EVERY = EnvVar(
    "SGLANG_DFLASH_DEBUG_FAIL_DRAFT_EVERY",
    int,
    0,
    "fault injection: every Nth draft step raises (the batch decodes undrafted; 0: never)",
    level=DEBUG,
)
DEBUG_FAIL_WARMUP = EnvVar(
    "SGLANG_DFLASH_DEBUG_FAIL_WARMUP",
    bool,
    False,
    "fault injection: the drafter attention's start-up warm-up raises",
    level=DEBUG,
)
DEBUG_STEER = EnvVar(
    "SGLANG_DFLASH_DEBUG_STEER",
    float,
    None,
    "debug: steer every loaded target to propose the steered tiny drafter's token (value: strength; "
    "controlled acceptance on dummy weights, bench/checks/e2e_check.py)",
    level=DEBUG,
)
DEBUG_BROKEN_RULE = EnvVar(
    "SGLANG_DFLASH_DEBUG_BROKEN_RULE",
    str,
    None,
    "tests: serve with one deliberately broken sampling rule (testing/broken_rules.py) to prove a test can fail",
    level=DEBUG,
)
DEBUG_RANDOM_WIDTH = EnvVar(
    "SGLANG_DFLASH_DEBUG_RANDOM_WIDTH",
    int,
    None,
    "debug: draw the verify width at random every step from the candidates (value: the seed; lossless "
    "under any widths)",
    level=DEBUG,
)
DEBUG_STEP_TRACE = EnvVar(
    "SGLANG_DFLASH_DEBUG_STEP_TRACE",
    str,
    None,
    "debug: append one JSON line per decode step here (batch size, width, stage and all-in seconds, "
    "commits, the controller's rates and cost corrections; bench/width_trace.py reads it)",
    level=DEBUG,
)
DEBUG_WIDTH_CYCLE = EnvVar(
    "SGLANG_DFLASH_DEBUG_WIDTH_CYCLE",
    str,
    None,
    "debug: comma-separated widths cycled by the first request's verify step count (e.g. `16,1,1,16`)",
    level=DEBUG,
)

# ---- tests -----------------------------------------------------------------------------------
TEST_CACHE = EnvVar(
    "SGLANG_DFLASH_TEST_CACHE",
    str,
    "/tmp/sglang_dflash_test_models",
    "tests: where generated tiny models and pairs are cached",
    level=DEBUG,
)
TEST_LOGS = EnvVar(
    "SGLANG_DFLASH_TEST_LOGS",
    str,
    "/tmp/sglang_dflash_logs",
    "tests: where the test servers' logs are written",
    level=DEBUG,
)

# ---- internal state --------------------------------------------------------------------------
CPU_SHIMS_LOGGED = EnvVar(
    "SGLANG_DFLASH_CPU_SHIMS_LOGGED",
    bool,
    False,
    "internal: set once the CPU `sgl_kernel` stand-in warning was shown",
    level=INTERNAL,
)

DECLARED = [v for v in list(globals().values()) if isinstance(v, EnvVar)]
