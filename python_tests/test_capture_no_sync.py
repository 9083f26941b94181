"""No captured draft step reads the device back on the host: every shape a CUDA server captures runs
its draft step with every device->host path armed to raise.

The shapes: SGLang's default capture buckets (graph_choice.DEFAULT_BUCKETS, 1..64), every verify
width 2..B, and each key the draft step adds (SGLANG_DFLASH_PROPOSAL's rule for unseeded sampled
rows), for a DFlash 1 and a DFlash 2 drafter (both selector walks), over greedy, seeded, unseeded
sampled and mixed batches (a grammar batch reaches the draft step as its sampling rows: grammar
masks act on the verify logits, after it). The step is srt/draft_stage.DraftStage.draft on the FlashInfer
path in CUDA-graph mode with FlashInfer's CPU stand-in, as a CUDA server runs it; the step-graph
backend runs the capture and every replay armed (its warm-up is not: CudaGraphs warms up before
capturing, where a host read is legal). On a CPU every tensor is already on the host, so the guard
is on the torch.Tensor methods that would copy to it, armed only within the captured region.
"""

import contextlib

import pytest
import torch

from sglang_dflash.model.config import parse_drafter_config
from sglang_dflash.model.drafter import DFlashDrafter
from sglang_dflash.pipeline import flashinfer_attention as fa
from sglang_dflash.pipeline.block import block_slots, build_block
from sglang_dflash.pipeline.context_kv import DraftKVCache
from sglang_dflash.pipeline.step_graphs import StepGraphs
from sglang_dflash.pipeline.target_sampling import SamplingRows
from sglang_dflash.srt import draft_stage
from sglang_dflash.srt.draft_stage import DraftStage
from sglang_dflash.srt.graph_choice import DEFAULT_BUCKETS
from sglang_dflash.testing.fake_flashinfer import FakePrefillWrapper
from sglang_dflash.testing.tiny_config import tiny_cfg_dict

B, V, CONTEXT = 4, 50, 24  # block, vocabulary, the server's context length
D2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
ARMED = [False]  # True inside a captured region


class HostRead(AssertionError):
    pass


def _deny(name, orig):
    def guarded(*a, **k):
        if ARMED[0]:
            raise HostRead(f"{name} inside a captured draft step")
        return orig(*a, **k)

    return guarded


def _is_cpu(dev) -> bool:
    return isinstance(dev, (str, torch.device)) and torch.device(dev).type == "cpu"


def _guards():
    """(owner, name, replacement) for every device->host path."""
    T = torch.Tensor
    out = [(T, n, _deny(f"Tensor.{n}", getattr(T, n))) for n in
           ("item", "__int__", "__index__", "__float__", "__bool__", "tolist", "cpu", "numpy", "nonzero",
            "masked_select", "unique")]  # fmt: skip
    out += [(torch, n, _deny(f"torch.{n}", getattr(torch, n))) for n in ("nonzero", "masked_select", "unique")]
    out += [(torch.cuda, "synchronize", _deny("torch.cuda.synchronize", torch.cuda.synchronize))]
    to, getitem = T.to, T.__getitem__

    def to_host(self, *a, **k):  # .to("cpu") / .to(device="cpu"): a copy to the host
        if ARMED[0] and (_is_cpu(k.get("device")) or any(_is_cpu(x) for x in a)):
            raise HostRead("Tensor.to(cpu) inside a captured draft step")
        return to(self, *a, **k)

    def index(self, idx):  # a boolean mask's result size is read back
        parts = idx if isinstance(idx, tuple) else (idx,)
        if ARMED[0] and any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
            raise HostRead("boolean-mask indexing inside a captured draft step")
        return getitem(self, idx)

    return out + [(T, "to", to_host), (T, "__getitem__", index)]


@contextlib.contextmanager
def armed(on: bool = True):
    was, ARMED[0] = ARMED[0], on
    try:
        yield
    finally:
        ARMED[0] = was


class ArmedGraphs:
    """Step-graph backend: an unarmed warm-up, then the capture and every replay armed. A host read
    makes the capture raise, which StepGraphs counts as a fallback; the first error is kept."""

    name = "armed"

    def __init__(self):
        self.errors = []

    def capture(self, fn):
        fn()
        try:
            with armed():
                fn()
        except HostRead as e:
            self.errors.append(str(e))
            raise
        return fn

    def replay(self, handle):
        with armed():
            return handle()


class Kernel(FakePrefillWrapper):
    """FlashInfer's run is a device kernel reading its own buffers: its CPU stand-in runs unarmed."""

    def run(self, q, paged):
        with armed(False):
            return super().run(q, paged)


def make_worker(dflash2, walk, buckets):
    torch.manual_seed(0)
    d2 = None if dflash2 is None else {**dflash2, "selector_walk": walk}
    cfg = parse_drafter_config(tiny_cfg_dict(block_size=B, dflash=d2), 4)
    drafter = DFlashDrafter(cfg)
    for p in drafter.parameters():
        torch.nn.init.normal_(p, std=0.2)
    drafter = drafter.to(torch.bfloat16).eval().requires_grad_(False).fuse_projections()
    drafter.rope_table(CONTEXT + B, "cpu")  # what the worker does at start-up
    rows = max(buckets) + 1  # request-pool rows; row 0 and slot 0 are SGLang's padding
    slots = rows * (CONTEXT + B)
    kv = DraftKVCache(cfg.num_layers, slots, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, "cpu")
    kv.k.normal_(), kv.v.normal_()
    req_to_token = torch.zeros(rows, CONTEXT + B, dtype=torch.int32)
    req_to_token[1:] = (torch.randperm(slots - 1)[: (rows - 1) * (CONTEXT + B)] + 1).view(rows - 1, -1)
    embed = torch.nn.Embedding(V, 32).to(torch.bfloat16)
    head = torch.randn(V, 32, dtype=torch.bfloat16)
    return DraftStage(
        drafter, lambda h: h @ head.t(), embed, kv, req_to_token, cfg, B, V, cfg.mask_token_id, cuda=True,
        graphs=StepGraphs(buckets, ArmedGraphs()),
    )  # fmt: skip


def sampling(kind: str, bs: int):
    """The batch's SamplingRows as srt/step_inputs.py fills them (None: every row greedy)."""
    if kind == "greedy":
        return None
    pick = {"seeded": lambda i: (0.8, i + 1), "unseeded": lambda i: (0.9, None)}
    pick["mixed"] = lambda i: [(0.0, None), (0.7, 11 * i), (1.1, None)][i % 3]
    temps, seeds = zip(*(pick[kind](i) for i in range(bs)))
    t = torch.tensor(temps)
    return SamplingRows(t, torch.ones_like(t), torch.full_like(t, -1), torch.zeros_like(t), list(seeds),
                        [3] * bs, sampled=[x > 0 for x in temps])  # fmt: skip


def draft(w, bs: int, kind: str, width: int, g):
    pool_rows = torch.arange(1, bs + 1)
    prefix = torch.randint(1, CONTEXT - B, (bs,), generator=g)
    block_ids, positions = build_block(torch.randint(0, V - 1, (bs,), generator=g), prefix, B, w.mask_token_id)
    slots = block_slots(w.req_to_token, pool_rows, prefix, B)
    return w.draft(pool_rows, prefix, slots, block_ids, positions, sampling(kind, bs), width)


CASES = [(None, "best", k, r) for k in ("greedy", "seeded") for r in ("qall",)]
CASES += [(None, "best", k, r) for k in ("unseeded", "mixed") for r in ("argmax", "q1", "qall")]
CASES += [(D2, walk, k, "qall") for walk in ("best", "chain") for k in ("greedy", "seeded", "unseeded", "mixed")]


@pytest.mark.parametrize("dflash2, walk, kind, rule", CASES)
def test_every_captured_draft_shape_reads_nothing_back(monkeypatch, dflash2, walk, kind, rule):
    buckets = list(DEFAULT_BUCKETS)
    monkeypatch.setattr(fa, "_wrapper", lambda dev, left, backend, fixed=None: Kernel(fixed))
    monkeypatch.setattr(draft_stage, "PROPOSAL", rule)
    for owner, name, fn in _guards():
        monkeypatch.setattr(owner, name, fn)
    w = make_worker(dflash2, walk, buckets)
    g = torch.Generator().manual_seed(1)
    for i, bucket in enumerate(buckets):
        for width in range(2, B + 1):
            out = draft(w, bucket, kind, width, g)  # captured, then replayed
            assert out.tokens.shape == (bucket, width)
            if i:  # a smaller batch replayed in the same bucket, its rows padded
                small = buckets[i - 1] + 1
                assert draft(w, small, kind, width, g).tokens.shape == (small, width)
    errors = w.graphs.backend.errors
    assert not errors, f"{len(errors)} shapes read the device back while captured; first: {errors[0]}"
    shapes = len(w.graphs.entries)
    assert shapes == len(buckets) * (B - 1) and w.graphs.counts["captured"] == shapes, dict(w.graphs.counts)
    assert set(w.graphs.counts) == {"captured", "replayed"}, dict(w.graphs.counts)  # no fallback
