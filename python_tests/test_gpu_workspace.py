"""The draft attention's CUDA-graph workspace (pipeline/flashinfer_attention.py) holds what FlashInfer
0.7.2's plan reserves for every captured bucket, on H100 (132 SMs) and B200 (148 SMs).

The oracle restates FlashInfer 0.7.2's plan step by step as its sources state it (utils.cuh
FA2DetermineCtaTileQ; attention/scheduler.cuh PrefillSplitQOKVIndptr and PrefillPlan, CUDA-graph
mode, page size 1), over every tile choice a GPU can make (the Ampere+ 16-row tile and its
shared-memory fallback to 64), so the sizing is checked against the rule, not against itself.
"""

import pytest
import torch

from sglang_dflash.pipeline import flashinfer_attention as fa
from sglang_dflash.testing.qwen3_8b_shape import QWEN3_8B

B = 16  # the Qwen3-8B drafters' block
HEADS, KV_HEADS, HEAD_DIM = (QWEN3_8B[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
SMS = {"H100": 132, "B200": 148}


def tiles_a_gpu_can_plan(packed_max: int, head_dim: int) -> set:
    """The CTA query tiles FA2DetermineCtaTileQ returns for this length on some GPU."""
    if head_dim >= 512:
        return {16 if packed_max <= 32 else 32}
    if packed_max > 64 and head_dim < 256:
        return {128}
    return {64} if packed_max > 16 else {16, 64}  # 64: pre-Ampere, or Ampere+ short of shared memory


def flashinfer_need(bs: int, heads: int, kv_heads: int, head_dim: int, num_sm: int) -> int:
    """Bytes of float workspace FlashInfer 0.7.2's CUDA-graph prefill plan reserves (split-kv forced
    by the graph's padded batch), the largest over the tiles a GPU can plan."""
    gqa, total = heads // kv_heads, bs * B
    longest = (total - bs + 1) * gqa  # graph mode: one request may hold all rows but one per other request
    worst = 0
    for tile in tiles_a_gpu_can_plan(longest, head_dim):
        tiles_q = -(-total * gqa // tile) + bs - 1
        padded = max((2 * num_sm) // kv_heads, tiles_q)
        partial_rows = -(-padded * tile // gqa)
        align = lambda n: -(-n // 16) * 16  # noqa: E731
        worst = max(worst, align(heads * partial_rows * head_dim * 4) + align(heads * partial_rows * 4))
    return worst


def allotted(bs: int, heads: int, kv_heads: int, head_dim: int, num_sm: int, monkeypatch) -> int:
    """What FlashInferBlockAttention gives a wrapper fixed for bs: the shared workspace, grown to its bound."""
    monkeypatch.setattr(fa, "_WORKSPACE", {})
    need = fa.graph_workspace_bytes(bs, B, heads, kv_heads, head_dim, num_sm)
    return fa._workspace(torch.device("meta"), need).numel()


# Qwen3-8B's drafter (32 query / 8 KV heads) and the same with fewer query heads per KV head: the
# sizing must hold for any drafter a server captures, not one ratio.
SHAPES = [(HEADS, KV_HEADS, HEAD_DIM), (HEADS, HEADS // 2, HEAD_DIM), (HEADS, HEADS, HEAD_DIM), (16, 16, 256)]


@pytest.mark.parametrize("gpu", sorted(SMS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-kv{}-d{}".format(*s))
def test_the_workspace_holds_flashinfers_plan_at_every_bucket_1_to_64(monkeypatch, gpu, shape):
    short = []
    for bs in range(1, 65):
        need, have = flashinfer_need(bs, *shape, SMS[gpu]), allotted(bs, *shape, SMS[gpu], monkeypatch)
        if have < need:
            short.append(f"bs {bs}: {need / 2**20:.0f} MiB needed, {have / 2**20:.0f} allotted")
    assert not short, f"{len(short)} buckets undersized; first: {short[0]}, last: {short[-1]}"


def test_the_largest_tile_is_planned_once_rows_exceed_64():
    """A captured batch of 2 or more 16-query requests plans 128-row tiles (graph mode's longest request)."""
    assert fa.graph_tile(16 * 4, 128) == 64 and fa.graph_tile(31 * 4, 128) == 128
    assert max(tiles_a_gpu_can_plan(16 * 4, 128)) == 64 and tiles_a_gpu_can_plan((2 * 16 - 1) * 4, 128) == {128}
