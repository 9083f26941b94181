"""DFlash Prometheus series beside SGLang's own (same label set), written from the scheduler process.

sglang:dflash_drafts_total                 blocks drafted (one per request per step)
sglang:dflash_draft_tokens_total           tokens proposed (B - 1 per block)
sglang:dflash_accepted_tokens_total{position=j}  drafts accepted at block position j (1..B-1)
sglang:dflash_accept_length                histogram of tokens committed per block (1..B, bonus included)
sglang:dflash_{draft,verify,sample,kv_write}_seconds  per-step stage times
sglang:dflash_draft_failures_total         draft steps that raised or drafted NaN/inf (undrafted)
sglang:dflash_graph_steps_total{event=E}   draft steps by step graph: captured, replayed, fallback:<reason>
sglang:dflash_verify_width                 histogram of the verify width chosen per step (1 = plain decode)
sglang:dflash_expected_tokens_per_second{width=W}  the width controller's current estimate per width
"""

from __future__ import annotations

import json
import time
from typing import Optional

import torch

STAGES = ("draft", "verify", "sample", "kv_write")  # a decode step's stages, in order (StageClock marks)


def sync(device_type: str) -> None:
    """Wait for queued device work (profiling: time the work, not its launch)."""
    if device_type == "cuda":
        torch.cuda.synchronize()


class StageClock:
    """Seconds per stage of one step. On CUDA, events recorded on the stream (host timestamps would
    measure kernel launches, not the work); they are read once, when the step reports them."""

    def __init__(self, device_type: str):
        self.cuda = device_type == "cuda"
        self.marks = [("start", self._now())]

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def mark(self, stage: str) -> None:
        self.marks.append((stage, self._now()))

    def seconds(self) -> dict:
        pairs = zip(self.marks, self.marks[1:])
        if not self.cuda:
            return {stage: b - a for (_, a), (stage, b) in pairs}
        self.marks[-1][1].synchronize()
        return {stage: a.elapsed_time(b) / 1000.0 for (_, a), (stage, b) in pairs}


def scheduler_labels() -> dict:
    """The label set SGLang puts on its scheduler metrics."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.runtime_context import get_disagg, get_observability, get_parallel, get_serving

    p = get_parallel()
    labels = {
        "model_name": get_serving().served_model_name,
        "engine_type": DisaggregationMode.to_engine_type(get_disagg().disaggregation_mode),
        "tp_rank": p.tp_rank,
        "pp_rank": p.pp_rank,
        "moe_ep_rank": p.moe_ep_rank,
    }
    if p.dp_rank is not None:
        labels["dp_rank"] = p.dp_rank
    labels.update(get_observability().extra_metric_labels or {})
    return {k: str(v) for k, v in labels.items()}


class DFlashMetrics:
    def __init__(self, block_size: int, labels: dict):
        from prometheus_client import Counter, Gauge, Histogram  # after SGLang set PROMETHEUS_MULTIPROC_DIR

        names = list(labels)
        self.labels, self.block = labels, block_size
        self.drafts = Counter("sglang:dflash_drafts", "Blocks drafted", names).labels(**labels)
        self.draft_tokens = Counter("sglang:dflash_draft_tokens", "Draft tokens proposed", names).labels(**labels)
        self.draft_failures = Counter("sglang:dflash_draft_failures", "Draft steps that raised", names).labels(**labels)
        self.graph_steps = Counter("sglang:dflash_graph_steps", "Draft steps by step graph", names + ["event"])
        self.graph_seen: dict = {}  # the step graph totals already exported
        self.accepted = Counter(
            "sglang:dflash_accepted_tokens", "Drafts accepted per block position", names + ["position"]
        )
        self.accept_len = Histogram(
            "sglang:dflash_accept_length", "Tokens committed per block", names, buckets=list(range(1, block_size + 1))
        ).labels(**labels)
        self.width = Histogram(
            "sglang:dflash_verify_width", "Verify width chosen per step", names, buckets=list(range(1, block_size + 1))
        ).labels(**labels)
        self.rate = Gauge(
            "sglang:dflash_expected_tokens_per_second",
            "Width controller: expected committed tokens per second at each width",
            names + ["width"],
            multiprocess_mode="mostrecent",
        )
        time_buckets = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
        self.times = {
            s: Histogram(f"sglang:dflash_{s}_seconds", f"DFlash {s} time per step", names, buckets=time_buckets).labels(
                **labels
            )
            for s in STAGES
        }

    def record_graphs(self, counts: dict) -> None:
        """Step graph counters (StepGraphs.counts, running totals): what grew since the last call."""
        for event, n in counts.items():
            if n > self.graph_seen.get(event, 0):
                self.graph_steps.labels(**self.labels, event=event).inc(n - self.graph_seen.get(event, 0))
                self.graph_seen[event] = n

    def record(self, commit_lens: list[int], seconds: dict, width: int, rates: dict) -> None:
        """One step: tokens committed per request, stage seconds, the width verified, and the
        controller's {width: expected tokens/s} at the choice (empty when not adaptive)."""
        n = len(commit_lens)
        self.width.observe(width)
        for w, r in rates.items():
            self.rate.labels(**self.labels, width=str(w)).set(r)
        if width > 1:
            self.drafts.inc(n)
            self.draft_tokens.inc(n * (width - 1))
        for pos in range(1, self.block):
            hits = sum(c - 1 >= pos for c in commit_lens)
            if hits:
                self.accepted.labels(**self.labels, position=str(pos)).inc(hits)
        for c in commit_lens if width > 1 else ():  # acceptance of drafted blocks only
            self.accept_len.observe(c)
        for stage, sec in seconds.items():
            self.times[stage].observe(sec)


def create(block_size: int) -> Optional[DFlashMetrics]:
    """Metrics on the rank that reports SGLang's scheduler metrics, when --enable-metrics is on."""
    from sglang.srt.runtime_context import get_observability, get_parallel

    obs, p = get_observability(), get_parallel()
    if not obs.enable_metrics or (p.tp_rank != 0 and not obs.enable_metrics_for_all_schedulers):
        return None
    return DFlashMetrics(block_size, scheduler_labels())


class StepTrace:
    """One JSON line per decode step (SGLANG_DFLASH_DEBUG_STEP_TRACE): what the width controller
    saw and chose, and what the step then cost, to see where a served run's time went."""

    def __init__(self, path: str):
        self.f = open(path, "a", buffering=1)

    def write(self, **fields) -> None:
        self.f.write(json.dumps(fields) + "\n")
