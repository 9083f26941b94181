"""Which step-graph backend a DFLASH server runs its draft steps with (SGLANG_DFLASH_GRAPHS), on
SGLang's own capture buckets: its decode capture list (`--cuda-graph-bs`), capped by
`--cuda-graph-max-bs`; `--disable-cuda-graph` turns CUDA graphs off as it does for plain decoding."""

from __future__ import annotations

import logging
from typing import Optional

from sglang_dflash import env
from sglang_dflash.pipeline.step_graphs import CompiledGraphs, CudaGraphs, EagerGraphs, StepGraphs, capture_buckets

logger = logging.getLogger("sglang_dflash")

# SGLang's default decode capture list when its config has none (its own default on small GPUs).
DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64)


def make_step_graphs(device_type: str, max_running: int, capturable: bool = True) -> Optional[StepGraphs]:
    """max_running: the scheduler's request cap (no bucket above what can run); capturable: the
    draft step can be held by a CUDA graph (attention_choice.capturable). `auto`: CUDA graphs on a
    CUDA device (unless --disable-cuda-graph or the step cannot be captured), off elsewhere."""
    mode = env.GRAPHS.get()
    if mode == "auto":
        if device_type != "cuda":
            return None
        mode = "cuda"
    if mode == "cuda" and not capturable:  # its key table would be baked into the graph at capture
        logger.warning("DFLASH step graphs: off (this drafter drafts with torch attention: not capturable)")
        return None
    if mode == "0":
        return None
    from sglang.srt.runtime_context import get_exec

    cfg = get_exec().graph.cuda_graph_config
    decode = getattr(cfg, "decode", None)
    if mode == "cuda":
        if device_type != "cuda":
            raise ValueError(f"{env.GRAPHS.name}=cuda needs a CUDA device (this server runs on {device_type})")
        if decode is None or decode.backend == "disabled":
            logger.info("DFLASH step graphs: off (--disable-cuda-graph)")
            return None
    sizes = (getattr(decode, "bs", None) if decode is not None else None) or DEFAULT_BUCKETS
    cap = getattr(decode, "max_bs", None) if decode is not None else None
    buckets = capture_buckets(sizes, min(cap or max_running, max_running))
    backend = CudaGraphs() if mode == "cuda" else CompiledGraphs() if mode == "compile" else EagerGraphs()
    logger.info("DFLASH step graphs: %s backend, batch-size buckets %s", backend.name, buckets)
    return StepGraphs(buckets, backend, check_first=mode == "cuda")
