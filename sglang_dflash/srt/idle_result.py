"""The result of a decode step over an idle or empty batch: no tokens, no draft, sequence lengths unchanged."""

from __future__ import annotations

import torch

from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.speculative.draft_worker_common import make_draft_input_v2


def idle_result(device, block_size: int, on_publish) -> GenerationBatchResult:
    empty = torch.empty((0,), dtype=torch.int64, device=device)
    nxt = make_draft_input_v2(bonus_tokens=empty, new_seq_lens=empty)
    if on_publish is not None:
        on_publish(nxt.new_seq_lens)
    return GenerationBatchResult(
        next_token_ids=empty,
        accept_lens=empty.to(torch.int32),
        next_draft_input=nxt,
        speculative_num_draft_tokens=block_size,
        new_seq_lens=nxt.new_seq_lens,
    )
