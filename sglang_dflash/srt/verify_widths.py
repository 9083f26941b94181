"""The target's verify forward at every width the controller plays, on CUDA.

SGLang sets a DFLASH target up for one verify width, the block size B: its attention backend
(FA3 lays the verify rows out for speculative_num_draft_tokens, whatever the batch says) and its
decode graph runner (TARGET_VERIFY captured with B tokens per request; a batch of another width
runs eagerly). Our steps verify W <= B rows. So each other width gets its own attention backend,
made as SGLang makes one with speculative_num_draft_tokens = W, and, where SGLang captures decode
graphs, its own DecodeCudaGraphRunner captured at W (one graph per batch-size bucket, in SGLang's
graph memory pool). `at(W)` swaps them in for one verify forward and back after it, so prefills and
every other forward see SGLang's own (width B is SGLang's own, read live: SGLang may recapture it).
A width whose graphs fail to capture verifies eagerly (counted); a width whose backend fails to build
is not played at all (counted; the controller drops it, srt/step_profile.py), and if SGLang's
factories cannot even be set up only width B is played: a renamed internal costs speed, never the
server. Each distinct error's traceback is logged once. A width outside the start-up set gets its
backend when first played (eager). The extra backends share SGLang's float workspace (all
forwards run one after another on one stream); what each adds is its graph index buffers. Under
LoRA, PD multiplexing or two-batch overlap, whose graph state SGLang's runner keeps per process,
the extra widths verify eagerly.

On CPU there is nothing to swap: our torch_native verify reads the width from the batch.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from typing import Callable, Iterable, Optional

logger = logging.getLogger("sglang_dflash")


class VerifyWidths:
    """runner: SGLang's target ModelRunner (attn_backend, decode_cuda_graph_runner).
    make_backend(W) -> an attention backend for width W; make_graphs(W, backend) -> a graph runner
    captured at W (None: graphs off). counts: captured / capture failed / backend failed per width.
    failed: the widths with no backend of their own; the controller never plays them."""

    def __init__(self, runner, block: int, make_backend: Callable, make_graphs: Optional[Callable]):
        self.runner, self.block = runner, block
        self.make_backend, self.make_graphs = make_backend, make_graphs
        self.states: dict = {}  # width -> (attention backend, graph runner or None); B: SGLang's, live
        self.counts: Counter = Counter()
        self.failed: set = set()
        self.errors: set = set()  # (type, message) of each failure already logged with its traceback

    def build(self, widths: Iterable[int]) -> "VerifyWidths":
        """Start-up: a backend, and graphs when on, for each width (B is SGLang's own)."""
        for w in sorted(set(widths)):
            if w != self.block and w not in self.states and w not in self.failed:
                self._make(w, graphs=True)
        return self

    def _make(self, width: int, graphs: bool):
        try:
            backend = self.make_backend(width)
        except Exception as e:  # noqa: BLE001 - one width's backend must not stop a GPU server's start-up
            self.failed.add(width)
            self.counts[f"width {width}: backend failed"] += 1
            self._log(e, f"verify width {width}: its attention backend failed to build", "the width is not played")
            return None
        runner = None
        if graphs and self.make_graphs is not None:
            try:
                runner = self.make_graphs(width, backend)
                self.counts[f"width {width}: captured"] += 1
            except Exception as e:  # noqa: BLE001 - this width verifies eagerly; tokens are the same
                self.counts[f"width {width}: capture failed"] += 1
                self._log(e, f"verify graphs for width {width} failed to capture", "it runs eagerly")
        self.states[width] = (backend, runner)
        return self.states[width]

    def _log(self, e: Exception, what: str, outcome: str) -> None:
        """One warning per failure; the traceback only the first time this error is seen (a renamed
        internal fails every width the same way)."""
        key = (type(e).__name__, str(e))
        first = key not in self.errors
        self.errors.add(key)
        logger.warning("DFLASH %s (%s: %s); %s", what, type(e).__name__, e, outcome, exc_info=first)

    @contextlib.contextmanager
    def at(self, width: int):
        """The target's backend and graph runner for width W during one verify forward."""
        if width == self.block:
            yield
            return
        state = None if width in self.failed else self.states.get(width) or self._make(width, graphs=False)
        if state is None:
            raise RuntimeError(f"DFLASH verify width {width} has no attention backend (see the start-up log)")
        r = self.runner
        saved = (r.attn_backend, r.decode_cuda_graph_runner)
        r.attn_backend, r.decode_cuda_graph_runner = state
        try:
            yield
        finally:
            r.attn_backend, r.decode_cuda_graph_runner = saved


def for_sglang(runner, block: int, widths: Iterable[int], graphs: bool = True) -> VerifyWidths:
    """VerifyWidths over SGLang's own factories: its attention backend and decode graph runner,
    each made while its spec config says speculative_num_draft_tokens = W (scoped, restored after).
    If the factories cannot be set up, every width but B is dropped (counted, logged once)."""
    widths = sorted(set(widths))
    try:
        make_backend, make_graphs, shared = _sglang_factories(runner)
        on = graphs and runner.decode_cuda_graph_runner is not None and not shared  # SGLang captures decode graphs
    except Exception as e:  # noqa: BLE001 - SGLang's width B still serves; ours are a speed-up
        out = VerifyWidths(runner, block, None, None)
        out.failed.update(w for w in widths if w != block)
        out.counts["setup failed"] += 1
        out._log(e, "verify widths: SGLang's factories could not be set up", f"only width {block} is played")
        return out
    out = VerifyWidths(runner, block, make_backend, make_graphs if on else None).build(widths)
    why = f"eager ({', '.join(shared)})" if shared else "eager (graphs off)"
    logger.info("DFLASH verify widths %s beside %d: %s", sorted(out.states), block, dict(out.counts) or why)
    return out


def _sglang_factories(runner):
    """(make_backend, make_graphs, the per-process graph features that keep extra widths eager)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.runtime_context import get_disagg, get_exec, get_spec

    def make_backend(width: int):
        saved = runner.init_new_workspace
        try:
            with get_spec().override(speculative_num_draft_tokens=width):
                return runner._get_attention_backend(init_new_workspace=False)
        finally:
            runner.init_new_workspace = saved

    def make_graphs(width: int, backend):
        with get_spec().override(speculative_num_draft_tokens=width):
            return DecodeCudaGraphRunner(runner, attn_backend=backend, speculative_num_draft_tokens=width)

    shared = [
        name
        for name, on in (
            ("LoRA", runner.lora_manager is not None),
            ("PD multiplexing", get_disagg().enable_pdmux),
            ("two-batch overlap", get_exec().overlap.enable_two_batch_overlap),
        )
        if on
    ]
    return make_backend, make_graphs, shared
