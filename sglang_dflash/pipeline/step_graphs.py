"""Stage (graphs): a step of a given shape replayed from what was captured for that shape.

A shape is (batch-size bucket, width, which optional inputs are present). A batch is padded up to
its bucket with rows that touch nothing real (their pad values: SGLang's padding slot 0, a
zero-length prefix, the mask token), its inputs are copied into the static buffers of that shape,
and the function captured for it is replayed; the outputs are cut back to the batch's rows. The
buckets are SGLang's own (its decode capture list, capped by --cuda-graph-max-bs).

Backends (the same padding and bookkeeping for all, so a CPU proves the code path a GPU runs):
  - CudaGraphs: one torch.cuda.CUDAGraph per shape, all in one memory pool of their own (a shape
    not met by the start-up profile is captured when first met; one that fails runs eagerly),
    warmed up on a side stream before capture;
  - EagerGraphs: the CPU twin: "replay" runs the function on the static buffers;
  - CompiledGraphs: the CPU twin compiled per shape (torch.compile), measured against eager;
  - testing.fake_graphs.FakeGraphs: records what was captured and replayed.
A batch above the largest bucket, or a shape whose capture raised, runs eagerly on its own inputs
and is counted as a fallback (by reason); a failed shape is never captured again.
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter
from typing import Callable, Optional, Sequence

import torch

logger = logging.getLogger("sglang_dflash")

Outputs = tuple  # of Optional[torch.Tensor], each [bs, ...] (None passes through)


class EagerGraphs:
    """The CPU twin: capture keeps the function, replay runs it on the static buffers."""

    name = "eager"

    def capture(self, fn: Callable[[], Outputs]):
        return fn

    def replay(self, handle) -> Outputs:
        return handle()


class CompiledGraphs:
    """The CPU twin compiled: capture compiles the step for its shape (torch.compile, static shapes:
    the static buffers never change shape), replay runs the compiled code on the static buffers.
    Compiling takes seconds per shape, so it pays only where a step's Python and op-by-op overhead
    outweighs that over a server's life; bench/graphs_bench.py measures it per (batch, width)."""

    name = "compile"

    def __init__(self, compile_backend: str = "inductor"):
        self.compile_backend = compile_backend

    def capture(self, fn: Callable[[], Outputs]):
        compiled = torch.compile(fn, backend=self.compile_backend, dynamic=False)
        compiled()  # compile now (at capture), not at the first replay
        return compiled

    def replay(self, handle) -> Outputs:
        return handle()


class CudaGraphs:
    """torch.cuda.CUDAGraph per shape; the captured function must not sync with the host."""

    name = "cuda"

    def __init__(self, warmup: int = 2):
        self.pool, self.warmup = None, warmup

    def capture(self, fn: Callable[[], Outputs]):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # lazy inits and allocator warm-up, outside the graph
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            out = fn()
        self.pool = graph.pool()
        return graph, out

    def replay(self, handle) -> Outputs:
        graph, out = handle
        graph.replay()
        return out


class _Entry:
    def __init__(self, static: dict, call: dict, handle, state):
        self.static, self.call, self.handle, self.state = static, call, handle, state
        self.checked = False


def _same(a: Outputs, b: Outputs) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y)) for x, y in zip(a, b)
    )


def capture_buckets(sizes: Optional[Sequence[int]], max_bs: Optional[int]) -> list[int]:
    """SGLang's capture batch sizes, capped by max_bs, sorted and unique (empty: nothing captured)."""
    out = sorted({int(s) for s in (sizes or []) if int(s) > 0})
    return [s for s in out if max_bs is None or s <= max_bs]


class StepGraphs:
    """The cache of captured step shapes. counts: captured / replayed / fallback:<reason>."""

    def __init__(self, buckets: Sequence[int], backend, check_first: bool = False):
        """check_first: a shape's first replay is compared with the same step run eagerly on the same
        static buffers; a shape whose outputs differ is never replayed again (counted)."""
        self.buckets, self.backend, self.check_first = list(buckets), backend, check_first
        self.entries: dict = {}
        self.failed: dict = {}  # shape -> why it runs eagerly
        self.states: dict = {}  # bucket -> prepare's state
        self.counts: Counter = Counter()

    def bucket(self, bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, bs)
        return self.buckets[i] if i < len(self.buckets) else None

    def run(
        self,
        fn: Callable[..., Outputs],
        inputs: dict,
        pads: dict,
        key: tuple = (),
        prepare: Optional[Callable] = None,
    ) -> Outputs:
        """fn(**inputs) -> Outputs; inputs {name: tensor [bs, ...] or None}; pads {name: the value a
        padded row holds}; key: what else fixes the shape (the width). The same outputs fn gives
        on the inputs, each cut to the batch's bs rows.

        prepare(state, fixed, **inputs) -> state: the host work a captured step cannot hold
        (FlashInfer's plan), run outside it before every replay (and the capture) on the static
        buffers; fn then takes that state first. fixed: for a bucket (state None: make it, else
        re-plan it in place and return it: the captured step holds that object); an eager fallback
        prepares a fresh unfixed state."""
        bs = next(v.shape[0] for v in inputs.values() if v is not None)
        bucket = self.bucket(bs)
        shape = (bucket, tuple(key), tuple(sorted(n for n, v in inputs.items() if v is not None)))
        if bucket is None or shape in self.failed:
            self.counts["fallback:" + ("batch above the largest bucket" if bucket is None else self.failed[shape])] += 1
            return self._eager(fn, inputs, prepare)
        entry = self.entries.get(shape)
        if entry is None:
            entry = self._capture(shape, fn, inputs, pads, bucket, prepare)
            if entry is None:
                return self._eager(fn, inputs, prepare)
        for name, v in inputs.items():
            if v is not None:
                buf = entry.static[name]
                buf[:bs].copy_(v)
                if bs < bucket:
                    buf[bs:].fill_(pads[name])
        if prepare is not None and prepare(entry.state, True, **entry.call) is not entry.state:
            raise RuntimeError("step graphs: prepare must re-plan the state it is given in place")
        out = self.backend.replay(entry.handle)
        if self.check_first and not entry.checked:
            entry.checked = True
            ref = fn(entry.state, **entry.call) if prepare is not None else fn(**entry.call)
            if not _same(out, ref):
                self.failed[shape] = "replay differed"
                del self.entries[shape]
                self.counts["fallback:replay differed"] += 1
                logger.warning("DFLASH step graph replay of %s differed from its eager step; it runs eagerly", shape)
                return tuple(None if o is None else o[:bs] for o in ref)
        self.counts["replayed"] += 1
        return tuple(None if o is None else o[:bs] for o in out)

    @staticmethod
    def _eager(fn, inputs: dict, prepare) -> Outputs:
        if prepare is None:
            return fn(**inputs)
        return fn(prepare(None, False, **inputs), **inputs)

    def _capture(self, shape, fn, inputs: dict, pads: dict, bucket: int, prepare) -> Optional[_Entry]:
        static = {}
        # Normal tensors even when the first step of a shape runs under inference mode (the
        # start-up profile): an inference tensor could not be written by later steps outside it.
        with torch.inference_mode(False):
            for name, v in inputs.items():
                if v is not None:
                    static[name] = torch.full((bucket, *v.shape[1:]), pads[name], dtype=v.dtype, device=v.device)
        call = {n: static.get(n) for n in inputs}
        state = None
        try:
            if prepare is not None:  # one state per bucket, shared by its shapes (re-planned per replay)
                state = prepare(self.states.get(bucket), True, **call)
                self.states[bucket] = state
                handle = self.backend.capture(lambda: fn(state, **call))
            else:
                handle = self.backend.capture(lambda: fn(**call))
        except Exception as e:  # noqa: BLE001 - a shape that cannot be captured runs eagerly, counted
            self.failed[shape] = "capture failed"
            self.counts["fallback:capture failed"] += 1
            logger.warning(
                "DFLASH step graph capture failed for %s (%s: %s); it runs eagerly", shape, type(e).__name__, e
            )
            return None
        self.counts["captured"] += 1
        entry = self.entries[shape] = _Entry(static, call, handle, state)
        return entry
