"""The LM head as the drafter reads it: the target's, whole or cut to the drafter's reduced vocabulary,
in the model dtype or in int8 rows (model/int8_head.py; SGLANG_DFLASH_DRAFT_HEAD)."""

from __future__ import annotations

import torch
from sglang.srt.distributed import tensor_model_parallel_all_gather
from sglang.srt.runtime_context import get_parallel

from sglang_dflash import env
from sglang_dflash.model.draft_vocab import ids_from_d2t
from sglang_dflash.model.int8_head import Int8Rows


def wants_int8(device: torch.device) -> bool:
    """SGLANG_DFLASH_DRAFT_HEAD: auto is int8 on CPU (the head is read from memory every draft step
    there; bench/draft_head_bench.py --int8), the model dtype on GPU."""
    choice = env.DRAFT_HEAD.get()
    return choice == "int8" or (choice == "auto" and device.type == "cpu")


class DraftHead:
    def __init__(self, lm_head, drafter, vocab_size: int):
        self.lm_head, self.vocab_size = lm_head, vocab_size
        self.tp = get_parallel().tp_size
        self.rows = None  # [N, H]: the head's rows of the drafter's N tokens (reduced vocabulary)
        w = lm_head.weight  # [V / tp, H] (vocab-parallel)
        d2t = getattr(drafter, "d2t", None)
        if d2t is not None:  # gather it whole once, at start-up
            if self.tp > 1:
                w = tensor_model_parallel_all_gather(w.t().contiguous(), dim=-1).t()
            self.rows = w[ids_from_d2t(d2t).to(w.device)].contiguous()
        self.int8 = None
        if wants_int8(w.device) and (self.rows is not None or self.tp == 1):
            self.int8 = Int8Rows(self.rows if self.rows is not None else w[:vocab_size])
            self.rows = None  # one copy of the head: the int8 one

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, V] (the target's vocabulary) or [N, draft_vocab_size]."""
        if self.int8 is not None:
            return self.int8(hidden)
        if self.rows is not None:
            return hidden.to(self.rows.dtype) @ self.rows.t()
        w = self.lm_head.weight
        logits = hidden.to(w.dtype) @ w.t()
        if self.tp > 1:
            logits = tensor_model_parallel_all_gather(logits.contiguous(), dim=-1)
        return logits[:, : self.vocab_size]
