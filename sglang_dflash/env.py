"""Every `SGLANG_DFLASH_*` environment variable: name, type, default, meaning, level. Read them only here.

Each is read when `.get()` is called (tests set them at run time). Levels: `user` (README's table is
`python -m sglang_dflash.env`'s output), `advanced` (tuning and build switches, the CPU ops' escape
hatch: `python -m sglang_dflash.env --all` lists them with the rest), `debug` and `internal` (debug,
fault-injection and test switches, internal state: declared in env_debug.py, re-exported here).
python_tests/test_single_sources.py checks the README rows against the declarations.
setup.py cannot import the package before it is built, so it reads BUILD_EXT and WERROR itself.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

from sglang_dflash.cpu_serving import THREADS_VAR

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
USER, ADVANCED, DEBUG, INTERNAL = "user", "advanced", "debug", "internal"


@dataclass(frozen=True)
class EnvVar:
    name: str
    type: type  # str, int, float or bool
    default: Any
    meaning: str
    choices: Optional[tuple[str, ...]] = None
    level: str = ADVANCED  # USER: in README's table

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


# ---- user: what a serving engineer sets ------------------------------------------------------
IMPL = EnvVar(
    "SGLANG_DFLASH_IMPL",
    str,
    "ours",
    "`builtin` hands DFLASH back to SGLang's built-in worker (GPU only)",
    choices=("ours", "builtin"),
    level=USER,
)
MODEL_DIR = EnvVar(
    "SGLANG_DFLASH_MODEL_DIR",
    str,
    "~/.cache/sglang_dflash/smollm2-135m-instruct",
    "where the embedded SmolLM2-135M-Instruct is derived (`embedded.py`)",
    level=USER,
)
BUILD_EXT = EnvVar(
    "SGLANG_DFLASH_BUILD_EXT",
    bool,
    True,
    "0: `pip install` skips the C++/CUDA extension (torch reference ops instead; read by setup.py itself)",
    level=USER,
)
WIDTH = EnvVar(
    "SGLANG_DFLASH_WIDTH",
    int,
    0,
    "verify width per step: 0 = chosen every step by the cost-aware controller; W (1..block) pins it",
    level=USER,
)
PROFILE = EnvVar(
    "SGLANG_DFLASH_PROFILE",
    bool,
    True,
    "0: skip the start-up step-cost profile (the controller then verifies the whole block)",
    level=USER,
)
CPU_THREADS = EnvVar(
    THREADS_VAR,
    int,
    0,
    "CPU: OpenMP threads of each scheduler's forward (cpu/cpu_threads.py): 0 = the cores its rank is bound "
    "to (SGLang's SGLANG_CPU_OMP_THREADS_BIND or NUMA node, within the process's affinity), N = N; the "
    "launching, tokenizer and detokenizer processes keep OMP_NUM_THREADS=1",
    level=USER,
)
CPU_ISA = EnvVar(
    "SGLANG_DFLASH_CPU_ISA",
    str,
    "auto",
    "CPU kernels' instruction set at most (csrc/cpu/cpu_features.h, capped by what the CPU has; read once per "
    "process): `auto` (the CPU's best), `scalar`, `avx2`, `avx512`, `avx512bf16`, `amx` (oneDNN's AMX GEMMs)",
    choices=("auto", "scalar", "avx2", "avx512", "avx512bf16", "amx"),
    level=USER,
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
    level=USER,
)
PROPOSAL = EnvVar(
    "SGLANG_DFLASH_PROPOSAL",
    str,
    "argmax",
    "DFlash 1 drafts of unseeded sampled requests: `argmax` (sample-and-match), `q1` (draft 1 drawn "
    "from the drafter's q, rejection), `qall` (every draft drawn from q, rejection)",
    choices=("argmax", "q1", "qall"),
    level=USER,
)
DRAIN_S = EnvVar(
    "SGLANG_DFLASH_DRAIN_S",
    int,
    60,
    "seconds a SIGTERM'd server lets running requests finish (new ones get 503 with Retry-After); the "
    "ones left are then aborted and the process exits 0 (srt/drain.py); keep the pod's "
    "terminationGracePeriodSeconds above preStop + this + 30",
    level=USER,
)

# ---- advanced: tuning, builds, the CPU ops' escape hatch -------------------------------------
REFERENCE_OPS = EnvVar(
    "SGLANG_DFLASH_REFERENCE_OPS",
    bool,
    False,
    "1: register the torch reference ops even when the C++ extension is built",
)
WERROR = EnvVar(
    "SGLANG_DFLASH_WERROR",
    bool,
    False,
    "1: build the extension with warnings as errors (`make install` and the build tests; read by setup.py itself)",
)
FORK_START = EnvVar(
    "SGLANG_DFLASH_FORK_START",
    bool,
    True,
    "CPU: fork SGLang's scheduler and detokenizer from the launching process instead of spawning "
    "them (they skip re-importing SGLang); 0: spawn",
)
WIDEN_MARGIN = EnvVar(
    "SGLANG_DFLASH_WIDEN_MARGIN",
    float,
    0.0,
    "how much faster (relative) the width controller must expect a speculative step to be than plain "
    "decoding before it speculates (pipeline/width.py); 0: whichever estimate is higher (measured "
    "best: docs/decisions/2026-12-07-widen-margin.md)",
)
PROFILE_BUDGET = EnvVar(
    "SGLANG_DFLASH_PROFILE_BUDGET",
    int,
    60,
    "seconds the start-up step-cost profile may take: batch sizes it cannot reach are extrapolated",
)
FLASHINFER_BACKEND = EnvVar(
    "SGLANG_DFLASH_FLASHINFER_BACKEND",
    str,
    "fa2",
    "FlashInfer backend of the drafter's block attention on GPU: `fa2` (the one SGLang's FlashInfer "
    "attention pins), `fa3` (Hopper), `auto` (FlashInfer's choice: fa3 on Hopper)",
    choices=("fa2", "fa3", "auto"),
)
CPU_OPS = EnvVar(
    "SGLANG_DFLASH_CPU_OPS",
    str,
    None,
    "CPU: overrides of the bf16 target's fused ops, each `auto` unless named, as `op=value,...`: "
    "`linear` (our GEMM kernel, csrc/cpu/bf16_linear_cpu.cpp: `1` every GEMM, `0` torch's), `packed` (weights "
    "packed once for oneDNN, cpu/packed_weights.py; auto: AMX hosts), `rope`, `norm` (our fused ops; auto: "
    "with the GEMM kernel), `stack` (cpu/llama_stack.py: `loop` without one-call layers, `0` SGLang's "
    "forward), `attention` (chain attention; `0`: gather + torch SDPA); e.g. `linear=0,stack=loop`",
)
# op -> its values (the first is the default); each op replaces one switch of RETIRED
CPU_OP_CHOICES = {
    "linear": ("auto", "1", "0"),
    "packed": ("auto", "1", "0"),
    "rope": ("auto", "1", "0"),
    "norm": ("auto", "1", "0"),
    "stack": ("auto", "loop", "0"),
    "attention": ("auto", "1", "0"),
}
RETIRED = {
    "SGLANG_DFLASH_CPU_LINEAR": "linear",
    "SGLANG_DFLASH_CPU_PACKED": "packed",
    "SGLANG_DFLASH_CPU_ROPE": "rope",
    "SGLANG_DFLASH_CPU_NORM": "norm",
    "SGLANG_DFLASH_CPU_STACK": "stack",
    "SGLANG_DFLASH_CPU_ATTENTION": "attention",
}


@functools.lru_cache(maxsize=16)
def parse_cpu_ops(raw: str) -> dict[str, str]:
    """`linear=0, stack=loop` -> every op's value (`auto` where not named)."""
    ops = {op: values[0] for op, values in CPU_OP_CHOICES.items()}
    for item in filter(None, (s.strip() for s in raw.split(","))):
        op, eq, value = (s.strip().lower() for s in item.partition("="))
        if not eq or op not in CPU_OP_CHOICES or value not in CPU_OP_CHOICES[op]:
            want = "; ".join(f"{o}={'|'.join(v)}" for o, v in CPU_OP_CHOICES.items())
            raise ValueError(f"{CPU_OPS.name}={raw!r}: {item!r} is not op=value; expected a comma list of {want}")
        ops[op] = value
    return ops


def cpu_op(op: str) -> str:
    """One CPU op's setting from SGLANG_DFLASH_CPU_OPS (`auto` unless overridden). The retired
    one-variable-per-op switches are refused, naming the form that replaced them."""
    for old, name in RETIRED.items():
        value = os.environ.get(old, "").strip()
        if value:
            raise ValueError(f"{old} was replaced by {CPU_OPS.name}: unset it and set {CPU_OPS.name}={name}={value}")
    return parse_cpu_ops(CPU_OPS.get() or "")[op]


def cpu_ops_with(raw: str, **overrides: str) -> str:
    """A SGLANG_DFLASH_CPU_OPS value: raw's overrides with these set (benches and tests build arms)."""
    ops = {k: v for k, v in parse_cpu_ops(raw).items() if v != CPU_OP_CHOICES[k][0]} | overrides
    order = [k for k in CPU_OP_CHOICES if k in ops] + [k for k in ops if k not in CPU_OP_CHOICES]
    value = ",".join(f"{k}={ops[k]}" for k in order)
    parse_cpu_ops(value)  # an unknown op or value raises, naming the choices
    return value


DECLARED = [v for v in list(globals().values()) if isinstance(v, EnvVar)]


def __getattr__(name: str):
    """The debug, test and internal switches (env_debug.py), reached as env.X; ALL: every level."""
    from sglang_dflash import env_debug

    if name == "ALL":
        return DECLARED + env_debug.DECLARED
    var = getattr(env_debug, name, None)
    if not isinstance(var, EnvVar):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return var


def table(levels=(USER,)) -> str:
    rows = [v for v in __getattr__("ALL") if v.level in levels]
    head = "| variable | type | default | meaning |\n| --- | --- | --- | --- |\n"
    return head + "\n".join(v.table_row() for v in rows)


if __name__ == "__main__":
    if "--all" in sys.argv[1:]:
        for level in (USER, ADVANCED, DEBUG, INTERNAL):
            print(f"\n{level}:\n{table((level,))}")
    else:
        print(table())
