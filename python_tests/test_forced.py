"""Forced acceptance: a target whose every output the drafter predicts gives tau == block size."""

import pytest

from sglang_dflash.testing.servers import generate_all, launch, prompts
from sglang_dflash.testing.tiny_drafter import STEER_TOKEN


@pytest.mark.server
@pytest.mark.parametrize("block", [16])
def test_forced_acceptance_full_blocks(pair, block):
    from sglang_dflash.testing.pairs import FORCED

    target, drafter = pair("llama", "float32", FORCED)
    steps = 3
    with launch(
        target, drafter, "float32", name="dflash-forced", extra=["--speculative-num-draft-tokens", str(block)]
    ) as srv:
        # prefill emits 1 token, then every verify step commits a whole block (the last one is cut
        # to the budget); SGLang's spec_accept_length is completion_tokens / verify steps.
        outs = generate_all(srv, prompts(8, seed=5, max_len=64), max_new_tokens=steps * block)
    for o in outs:
        assert o["output_ids"] == [STEER_TOKEN] * (steps * block)
        assert o["meta_info"]["spec_verify_ct"] == steps
        assert o["meta_info"]["spec_accept_length"] == block
        # every block was accepted whole; the last one is cut to the budget (15 drafts + bonus)
        hist = o["meta_info"]["spec_correct_drafts_histogram"]
        assert hist[block - 1] == steps - 1 and hist[block - 2] == 1 and sum(hist) == steps
