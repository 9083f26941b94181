"""Faults: a drafter step that raises degrades that batch to plain decoding; outputs stay exact,
the log says what happened, and the server keeps serving. A server killed mid-load (SIGKILL to
every process) starts again on the same port with no clean-up and serves exactly."""

import os
import signal
import subprocess
import threading
import time

import pytest

from sglang_dflash.testing.servers import assert_lossless, free_port, generate_all, launch, prompts, reference

PROMPTS = prompts(12, seed=9, max_len=120)


@pytest.fixture(scope="module")
def models(pair):
    from sglang_dflash.testing.pairs import MIXED

    target, drafter = pair("llama", "float32", MIXED["llama"])
    with launch(target, None, "float32", name="plain-faults") as plain:
        refs = reference(plain, PROMPTS, 32)
    return target, drafter, refs


@pytest.mark.server
def test_failing_draft_steps_keep_outputs_exact(models):
    target, drafter, refs = models
    with launch(
        target, drafter, "float32", name="dflash-faults", env={"SGLANG_DFLASH_DEBUG_FAIL_DRAFT_EVERY": "3"}
    ) as srv:
        outs = generate_all(srv, PROMPTS, 32)
        again = generate_all(srv, PROMPTS[:2], 32)
        log = srv.log()
    assert_lossless(refs, outs, 1e-4)
    assert [o["output_ids"] for o in again] == [r["output_ids"] for r in refs[:2]]
    assert "injected drafter failure" in log and "decodes without a draft" in log
    assert max(o["meta_info"]["spec_accept_length"] for o in outs) > 1.5  # the other steps still speculate


@pytest.mark.server
def test_killed_mid_load_restarts_clean(models):
    target, drafter, refs = models
    port = free_port()
    errors = []

    def load(url):
        # Keep the server busy until it dies: one round can finish before the kill on a fast host.
        deadline = time.time() + 300
        while not errors and time.time() < deadline:
            try:
                generate_all_quiet(url)
            except Exception as e:  # noqa: BLE001 - the server dies under these requests on purpose
                errors.append(e)

    with launch(target, drafter, "float32", name="dflash-killed", port=port, check_drafts=False) as srv:
        clients = threading.Thread(target=load, args=(srv,))
        clients.start()
        time.sleep(3)
        pgid = os.getpgid(srv.proc.pid)
        os.killpg(pgid, signal.SIGKILL)
        srv.proc.wait(30)
        clients.join(120)
    time.sleep(2)
    left = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes survived the kill: {left}"
    assert errors, "the clients should have seen the server die"
    with launch(target, drafter, "float32", name="dflash-restarted", port=port) as srv:
        outs = generate_all(srv, PROMPTS, 32)
    assert_lossless(refs, outs, 1e-4)


def generate_all_quiet(srv):
    generate_all(srv, PROMPTS * 4, 400, ignore_eos=True)
