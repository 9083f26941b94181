"""The draft head's rows in int8 (weight-only, one scale per row) for CPU serving.

Every draft step reads the whole draft head ([N, H]: 16,384 x 576 bf16 is 18.9 MB, more than
half of what the draft stage reads) from memory, because the target's verify between two draft
steps evicts it from cache. Int8 rows halve those bytes. Only proposals change, and only where two
draft logits are nearly tied: verify stays the target's own full-precision head, so the output is
unchanged and the cost, if any, is tau (measured in bench/draft_head_bench.py --int8).
"""

from __future__ import annotations

import torch


class Int8Rows:
    """rows [N, H] float -> int8 rows + per-row scale; __call__(hidden [M, H]) -> logits [M, N]."""

    def __init__(self, rows: torch.Tensor):
        w = rows.float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)  # [N]: symmetric, max |w| -> 127
        self.q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous()  # [N, H]
        self.scale = scale.to(rows.dtype)
        self.dtype = rows.dtype

    def dequantized(self) -> torch.Tensor:
        """[N, H] in the rows' dtype: what the int8 rows stand for (tests, references)."""
        return (self.q.float() * self.scale.float()[:, None]).to(self.dtype)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        # aten's weight-only int8 GEMM (gpt-fast's CPU path): int8 weights read once, scaled per row
        return torch.ops.aten._weight_int8pack_mm(hidden.to(self.dtype).contiguous(), self.q, self.scale)
