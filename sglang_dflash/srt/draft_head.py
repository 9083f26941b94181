"""The LM head as the drafter reads it: the target's, whole or cut to the drafter's reduced vocabulary."""

from __future__ import annotations

import torch
from sglang.srt.distributed import tensor_model_parallel_all_gather
from sglang.srt.runtime_context import get_parallel

from sglang_dflash.model.draft_vocab import ids_from_d2t
from sglang_dflash.cpu.cpu_linear import linear


class DraftHead:
    def __init__(self, lm_head, drafter, vocab_size: int):
        self.lm_head, self.vocab_size = lm_head, vocab_size
        self.tp = get_parallel().tp_size
        self.rows = None  # [N, H]: the head's rows of the drafter's N tokens (reduced vocabulary)
        d2t = getattr(drafter, "d2t", None)
        if d2t is not None:
            w = lm_head.weight  # [V / tp, H] (vocab-parallel): gather it whole once, at start-up
            if self.tp > 1:
                w = tensor_model_parallel_all_gather(w.t().contiguous(), dim=-1).t()
            self.rows = w[ids_from_d2t(d2t).to(w.device)].contiguous()

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, V] (the target's vocabulary) or [N, draft_vocab_size]."""
        if self.rows is not None:
            return linear(hidden.to(self.rows.dtype), self.rows)
        w = self.lm_head.weight
        logits = linear(hidden.to(w.dtype), w)
        if self.tp > 1:
            logits = tensor_model_parallel_all_gather(logits.contiguous(), dim=-1)
        return logits[:, : self.vocab_size]
