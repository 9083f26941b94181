"""A width-W step drafts the block's first W rows only (pipeline/draft.draft_rows): the drafter's
forward runs on [anchor, MASK x (W-1)], not on the whole trained block."""

import torch
from test_capture_no_sync import B, draft, make_worker

from sglang_dflash.pipeline import draft as draft_mod
from sglang_dflash.pipeline.draft import draft_rows
from sglang_dflash.srt import draft_stage


def test_draft_rows_are_the_verified_rows():
    assert [draft_rows(w, 16) for w in (2, 3, 4, 8, 15, 16, 32)] == [2, 3, 4, 8, 15, 16, 16]
    assert draft_rows(None, 16) == 16  # no width: the whole block
    assert draft_rows(1, 16) == 2  # never below anchor + one draft
    assert draft_rows(4, 16, selector=object()) == 16  # DFlash 2 keeps the block it was trained on


def test_draft_step_drafts_only_the_verified_rows(monkeypatch):
    w = make_worker(None, "best", [4])
    w.cuda, w.graphs = False, None  # the torch block attention, eager
    seen = []
    orig = draft_mod.propose

    def spy(drafter, attend, embed, head, block_ids, positions, *a, **k):
        seen.append(tuple(block_ids.shape))
        return orig(drafter, attend, embed, head, block_ids, positions, *a, **k)

    monkeypatch.setattr(draft_stage, "propose", spy)
    for width in range(2, B + 1):
        g = torch.Generator().manual_seed(width)
        out = draft(w, 3, "greedy", width, g)
        assert seen[-1] == (3, width) and out.tokens.shape == (3, width)
