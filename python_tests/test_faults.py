"""Faults: a drafter step that raises degrades that batch to plain decoding; outputs stay exact,
the log says what happened, and the server keeps serving."""
import pytest

from harness import assert_lossless, generate_all, launch, prompts, reference

PROMPTS = prompts(12, seed=9, max_len=120)


@pytest.mark.server
def test_failing_draft_steps_keep_outputs_exact(pair):
    from conftest import MIXED

    target, drafter = pair("llama", "float32", MIXED["llama"])
    with launch(target, None, "float32", name="plain-faults") as plain:
        refs = reference(plain, PROMPTS, 32)
    with launch(target, drafter, "float32", name="dflash-faults",
                env={"SGLANG_DFLASH_DEBUG_FAIL_DRAFT_EVERY": "3"}) as srv:
        outs = generate_all(srv, PROMPTS, 32)
        again = generate_all(srv, PROMPTS[:2], 32)
        log = srv.log()
    assert_lossless(refs, outs, 1e-4)
    assert [o["output_ids"] for o in again] == [r["output_ids"] for r in refs[:2]]
    assert "injected drafter failure" in log and "decodes without a draft" in log
    assert max(o["meta_info"]["spec_accept_length"] for o in outs) > 1.5  # the other steps still speculate
