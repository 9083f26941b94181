"""Every `SGLANG_DFLASH_*` environment variable: name, type, default, meaning. Read them only here.

Each is read when `.get()` is called (tests set them at run time). `python -m sglang_dflash.env`
prints the table of all of them. The README's table holds the user-facing ones (its rows are that
output's rows); the debug, fault-injection, test and internal switches are listed here only:

- SGLANG_DFLASH_DEBUG_DUMP_DIR: save each request's drafter context K/V after prefill to this folder.
- SGLANG_DFLASH_DEBUG_FAIL_DRAFT_EVERY=N: every Nth draft step raises (the batch decodes undrafted).
- SGLANG_DFLASH_DEBUG_FAIL_WARMUP=1: the drafter attention's start-up warm-up raises.
- SGLANG_DFLASH_DEBUG_STEER=S: steer every loaded target toward the steered tiny drafter's token
  (controlled acceptance on dummy weights; bench/checks/e2e_check.py).
- SGLANG_DFLASH_DEBUG_BROKEN_RULE=RULE: serve with one deliberately broken sampling rule
  (testing/broken_rules.py), so the served distribution tests show they can fail.
- SGLANG_DFLASH_DEBUG_RANDOM_WIDTH=SEED: a random verify width every step (lossless under any widths).
- SGLANG_DFLASH_DEBUG_WIDTH_CYCLE=16,1,1,16: widths cycled by the first request's verify count.
- SGLANG_DFLASH_DEBUG_STEP_TRACE=PATH: one JSON line per decode step (bench/width_trace.py reads it).
- SGLANG_DFLASH_TEST_CACHE, SGLANG_DFLASH_TEST_LOGS: where the tests cache tiny models and write
  server logs.
- SGLANG_DFLASH_TEST_BROKEN_RULES=1: test_sampled_rules.py also serves each broken sampling rule and
  requires that the served test fails it (four more servers; its results are kept in docs/testing.md).
- SGLANG_DFLASH_CPU_SHIMS_LOGGED: internal, set once the CPU `sgl_kernel` stand-in warning was shown.

python_tests/test_single_sources.py checks the README rows and this list against the declarations.
setup.py cannot import the package before it is built, so it reads BUILD_EXT and WERROR itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from sglang_dflash.cpu_serving import THREADS_VAR

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class EnvVar:
    name: str
    type: type  # str, int or bool
    default: Any
    meaning: str
    choices: Optional[tuple[str, ...]] = None

    def get(self) -> Any:
        raw = os.environ.get(self.name, "").strip()
        if not raw:  # unset or empty: the default
            return self.default
        if self.type is bool:
            if raw.lower() not in _TRUE + _FALSE:
                raise ValueError(f"{self.name}={raw!r}: expected 1 or 0")
            return raw.lower() in _TRUE
        if self.type is int:
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{self.name}={raw!r}: expected an integer") from None
        if self.type is float:
            try:
                return float(raw)
            except ValueError:
                raise ValueError(f"{self.name}={raw!r}: expected a number") from None
        if self.choices is not None:
            raw = raw.lower()
            if raw not in self.choices:
                raise ValueError(
                    f"{self.name}={raw!r}: expected one of {', '.join(self.choices)} (default {self.default})"
                )
        return raw

    def table_row(self) -> str:
        shown = int(self.default) if self.type is bool else self.default
        default = "unset" if self.default is None else f"`{shown}`"
        return f"| `{self.name}` | {self.type.__name__} | {default} | {self.meaning} |"


# ---- serving ---------------------------------------------------------------------------------
IMPL = EnvVar(
    "SGLANG_DFLASH_IMPL",
    str,
    "ours",
    "`builtin` hands DFLASH back to SGLang's built-in worker (GPU only)",
    choices=("ours", "builtin"),
)
MODEL_DIR = EnvVar(
    "SGLANG_DFLASH_MODEL_DIR",
    str,
    "~/.cache/sglang_dflash/smollm2-135m-instruct",
    "where the embedded SmolLM2-135M-Instruct is derived (`embedded.py`)",
)
REFERENCE_OPS = EnvVar(
    "SGLANG_DFLASH_REFERENCE_OPS",
    bool,
    False,
    "1: register the torch reference ops even when the C++ extension is built",
)
BUILD_EXT = EnvVar(
    "SGLANG_DFLASH_BUILD_EXT", bool, True, "0: `pip install` skips the C++/CUDA extension (read by setup.py itself)"
)
WERROR = EnvVar(
    "SGLANG_DFLASH_WERROR",
    bool,
    False,
    "1: build the extension with warnings as errors (`make install` and the build tests; read by setup.py itself)",
)
WIDTH = EnvVar(
    "SGLANG_DFLASH_WIDTH",
    int,
    0,
    "verify width per step: 0 = chosen every step by the cost-aware controller; W (1..block) pins it",
)
PROFILE = EnvVar(
    "SGLANG_DFLASH_PROFILE",
    bool,
    True,
    "0: skip the start-up step-cost profile (the controller then verifies the whole block)",
)
FORK_START = EnvVar(
    "SGLANG_DFLASH_FORK_START",
    bool,
    True,
    "CPU: fork SGLang's scheduler and detokenizer from the launching process instead of spawning "
    "them (they skip re-importing SGLang: a tiny-model server is healthy in ~20 s instead of ~33 s); 0: spawn",
)
CPU_THREADS = EnvVar(
    THREADS_VAR,
    int,
    0,
    "CPU: OpenMP threads of each scheduler's forward (srt/cpu_threads.py): 0 = the cores its rank is bound "
    "to (SGLang's SGLANG_CPU_OMP_THREADS_BIND or NUMA node, within the process's affinity), N = N; the "
    "launching, tokenizer and detokenizer processes keep OMP_NUM_THREADS=1",
)
PROFILE_BUDGET = EnvVar(
    "SGLANG_DFLASH_PROFILE_BUDGET",
    int,
    60,
    "seconds the start-up step-cost profile may take: batch sizes it cannot reach are extrapolated",
)
CPU_LINEAR = EnvVar(
    "SGLANG_DFLASH_CPU_LINEAR",
    str,
    "auto",
    "DFLASH servers' bf16 target GEMMs on CPU through our kernel (csrc/bf16_linear_cpu.cpp): "
    "`auto` (every GEMM where oneDNN has no native bf16; where it has, up to 3 rows, 64 with AVX512-BF16, "
    "8 where AMX tiles serve oneDNN, 4 there with the weights packed), `1` (every GEMM), `0` (torch's)",
    choices=("auto", "1", "0"),
)
CPU_PACKED = EnvVar(
    "SGLANG_DFLASH_CPU_PACKED",
    str,
    "auto",
    "DFLASH servers' bf16 target weights packed once for oneDNN (srt/packed_weights.py), for the GEMMs wider "
    "than our kernel takes (up to 4 rows then where the CPU has AMX tiles): `auto` (where the CPU has AMX "
    "bf16 tiles), `1` (wherever torch's oneDNN packs bf16), `0` (torch's linear, which reorders the weight "
    "every call); packing keeps a second copy of the weights in memory",
    choices=("auto", "1", "0"),
)
CPU_ROPE = EnvVar(
    "SGLANG_DFLASH_CPU_ROPE",
    str,
    "auto",
    "DFLASH servers' bf16 rotary embedding on CPU through our fused op (csrc/rope_cpu.cpp, bit-identical "
    "to SGLang's): `auto` (with the CPU GEMM kernel), `1` (any bf16 CPU target), `0` (SGLang's)",
    choices=("auto", "1", "0"),
)
CPU_NORM = EnvVar(
    "SGLANG_DFLASH_CPU_NORM",
    str,
    "auto",
    "DFLASH servers' bf16 RMSNorm (with its residual add) on CPU through our fused op (csrc/rms_norm_cpu.cpp, "
    "bit-identical to SGLang's): `auto` (with the CPU GEMM kernel), `1` (any bf16 CPU target), `0` (SGLang's)",
    choices=("auto", "1", "0"),
)
CPU_STACK = EnvVar(
    "SGLANG_DFLASH_CPU_STACK",
    str,
    "auto",
    "DFLASH servers' bf16 CPU Llama target: decode and verify steps (up to 32 rows) run the layer stack as one "
    "loop of our fused ops instead of SGLang's per-layer boundary machinery (srt/llama_stack.py, bit-identical), "
    "each layer of a verify step of up to 4 rows a request one C++ call (csrc/llama_layer_cpu.cpp): `auto` (on), "
    "`loop` (the loop only, no one-call layers), `0` (SGLang's forward)",
    choices=("auto", "loop", "0"),
)
CPU_ATTENTION = EnvVar(
    "SGLANG_DFLASH_CPU_ATTENTION",
    str,
    "1",
    "DFLASH servers' verify and draft-block attention on CPU through our fused op (csrc/chain_attention_cpu.cpp: "
    "K/V read in place through the slot table, no gathered copy): `1` (float32 and bf16), `0` (gather + torch SDPA)",
    choices=("1", "0"),
)
CPU_ISA = EnvVar(
    "SGLANG_DFLASH_CPU_ISA",
    str,
    "auto",
    "CPU kernels' instruction set at most (csrc/cpu_features.h, capped by what the CPU has; read once per "
    "process): `auto` (the CPU's best), `scalar`, `avx2`, `avx512`, `avx512bf16`, `amx` (oneDNN's AMX GEMMs)",
    choices=("auto", "scalar", "avx2", "avx512", "avx512bf16", "amx"),
)
GRAPHS = EnvVar(
    "SGLANG_DFLASH_GRAPHS",
    str,
    "auto",
    "DFLASH draft steps replayed per (batch-size bucket, width) from SGLang's capture buckets "
    "(pipeline/step_graphs.py): `cuda` (CUDA graphs), `eager` (the CPU twin: padded static buffers run "
    "eagerly), `compile` (the CPU twin compiled per shape with torch.compile), `0` (off, and no verify graphs "
    "beyond SGLang's own at the block size); `auto`: `cuda` on a CUDA device, off on CPU. On CUDA the verify "
    "forward of every played width replays its own captured graphs (srt/verify_widths.py); "
    "--disable-cuda-graph turns both off (docs/graphs.md)",
    choices=("auto", "cuda", "eager", "compile", "0"),
)
PROPOSAL = EnvVar(
    "SGLANG_DFLASH_PROPOSAL",
    str,
    "qall",
    "DFlash 1 drafts of unseeded sampled requests: `argmax` (sample-and-match), `q1` (draft 1 drawn "
    "from the drafter's q, rejection), `qall` (every draft drawn from q, rejection)",
    choices=("argmax", "q1", "qall"),
)
FLASHINFER_BACKEND = EnvVar(
    "SGLANG_DFLASH_FLASHINFER_BACKEND",
    str,
    "fa2",
    "FlashInfer backend of the drafter's block attention on GPU: `fa2` (the one SGLang's FlashInfer "
    "attention pins), `fa3` (Hopper), `auto` (FlashInfer's choice: fa3 on Hopper)",
    choices=("fa2", "fa3", "auto"),
)
DRAIN_S = EnvVar(
    "SGLANG_DFLASH_DRAIN_S",
    int,
    60,
    "seconds a SIGTERM'd server lets running requests finish (new ones get 503 with Retry-After); the "
    "ones left are then aborted and the process exits 0 (srt/drain.py); keep the pod's "
    "terminationGracePeriodSeconds above preStop + this + 30",
)
CPU_SHIMS_LOGGED = EnvVar(
    "SGLANG_DFLASH_CPU_SHIMS_LOGGED", bool, False, "internal: set once the CPU `sgl_kernel` stand-in warning was shown"
)

# ---- debugging -------------------------------------------------------------------------------
DEBUG_DUMP_DIR = EnvVar(
    "SGLANG_DFLASH_DEBUG_DUMP_DIR", str, None, "debug: save each request's drafter context K/V after prefill here"
)
DEBUG_FAIL_DRAFT_EVERY = EnvVar(
    "SGLANG_DFLASH_DEBUG_FAIL_DRAFT_EVERY", int, 0, "fault injection: every Nth draft step raises (0: never)"
)
DEBUG_FAIL_WARMUP = EnvVar(
    "SGLANG_DFLASH_DEBUG_FAIL_WARMUP", bool, False, "fault injection: the drafter attention's start-up warm-up raises"
)
DEBUG_STEER = EnvVar(
    "SGLANG_DFLASH_DEBUG_STEER",
    float,
    None,
    "debug: steer every loaded target to propose the steered tiny drafter's token (value: strength; "
    "controlled acceptance on dummy weights, bench/checks/e2e_check.py)",
)
DEBUG_BROKEN_RULE = EnvVar(
    "SGLANG_DFLASH_DEBUG_BROKEN_RULE",
    str,
    None,
    "tests: serve with one deliberately broken sampling rule (testing/broken_rules.py) to prove a test can fail",
)
DEBUG_RANDOM_WIDTH = EnvVar(
    "SGLANG_DFLASH_DEBUG_RANDOM_WIDTH",
    int,
    None,
    "debug: draw the verify width at random every step from the candidates (value: the seed)",
)
DEBUG_STEP_TRACE = EnvVar(
    "SGLANG_DFLASH_DEBUG_STEP_TRACE",
    str,
    None,
    "debug: append one JSON line per decode step here (batch size, width, stage and all-in seconds, "
    "commits, the controller's rates and cost corrections; bench/width_trace.py reads it)",
)
DEBUG_WIDTH_CYCLE = EnvVar(
    "SGLANG_DFLASH_DEBUG_WIDTH_CYCLE",
    str,
    None,
    "debug: comma-separated widths cycled by the first request's verify step count (e.g. `16,1,1,16`)",
)

# ---- tests -----------------------------------------------------------------------------------
TEST_CACHE = EnvVar(
    "SGLANG_DFLASH_TEST_CACHE",
    str,
    "/tmp/sglang_dflash_test_models",
    "tests: where generated tiny models and pairs are cached",
)
TEST_BROKEN_RULES = EnvVar(
    "SGLANG_DFLASH_TEST_BROKEN_RULES",
    bool,
    False,
    "tests: 1 also serves each deliberately broken sampling rule and requires the served test to fail it",
)
TEST_LOGS = EnvVar(
    "SGLANG_DFLASH_TEST_LOGS", str, "/tmp/sglang_dflash_logs", "tests: where the test servers' logs are written"
)

ALL = [v for v in list(globals().values()) if isinstance(v, EnvVar)]


def table() -> str:
    head = "| variable | type | default | meaning |\n| --- | --- | --- | --- |\n"
    return head + "\n".join(v.table_row() for v in ALL)


if __name__ == "__main__":
    print(table())
