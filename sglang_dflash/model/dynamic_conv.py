"""DFlash 2's grouped dynamic depthwise convolution (plain torch).

Each attention and MLP sublayer of a DFlash 2 drafter is wrapped by one of these: `prepare` runs on
the sublayer's (normed) input, `finish` on its output, before the residual add:

    y[i, c] = sum_t (base[side, t, c] + delta[i, side, t, g(c)]) * x[i - t, c],   g(c) = c // group

Both coefficient sets come from ONE projection of the sublayer input (kernel_projection, H ->
2 * taps * H/group, split into the prepare half and the finish half). Taps never cross a block
start: row i reads x[i - t] only when i - t lies in the same block (the anchor reads zeros), so the
rows of different requests (and different training blocks) never mix. Checkpoint weights:
`layers.N.{attention,mlp}_conv.{base_kernel [2, taps, H], kernel_projection.weight [2*taps*H/group, H]}`.
"""

from __future__ import annotations

import torch
import torch.nn as nn

PREPARE, FINISH = 0, 1


class DynamicConv(nn.Module):
    def __init__(self, hidden: int, taps: int, group: int):
        super().__init__()
        self.taps, self.group, self.groups = taps, group, hidden // group
        base = torch.zeros(2, taps, hidden)
        base[:, 0] = 1.0  # identity at initialization
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)

    def coefficients(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] sublayer input -> per-row coefficients [N, 2, taps, H] (prepare, finish)."""
        delta = self.kernel_projection(x).view(x.shape[0], 2, self.taps, self.groups)
        delta = delta.repeat_interleave(self.group, dim=-1)
        return self.base_kernel.to(x.dtype)[None] + delta

    # Not named `apply`: that would shadow nn.Module.apply, so `drafter.apply(init_fn)` would break.
    def convolve(self, x: torch.Tensor, coef: torch.Tensor, block: int) -> torch.Tensor:
        """x [N, H] rows laid out as consecutive blocks of `block`; coef [N, taps, H] -> [N, H]."""
        n = x.shape[0]
        pos_in_block = torch.arange(n, device=x.device) % block
        out = coef[:, 0] * x
        for t in range(1, self.taps):
            shifted = torch.zeros_like(x)
            if t < n:
                shifted[t:] = x[:-t]
            valid = (pos_in_block >= t).to(x.dtype)[:, None]
            out = out + coef[:, t] * shifted * valid
        return out
