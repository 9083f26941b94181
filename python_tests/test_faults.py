"""Faults: a drafter step that raises degrades that batch to plain decoding; outputs stay exact,
the log says what happened, and the server keeps serving. A drafter whose output is NaN or inf
(raising nothing) never changes a token: greedy outputs equal plain decoding, seeded outputs equal a
healthy run's, every unseeded sampled token lies in the target's top-k, and the failures are counted.
A server killed mid-load (SIGKILL to every process) starts again on the same port with no clean-up
and serves exactly."""

import concurrent.futures as cf
import os
import signal
import subprocess
import threading
import time

import pytest

from sglang_dflash.testing.servers import (
    assert_lossless,
    dflash_state,
    free_port,
    generate_all,
    launch,
    prompts,
    reference,
)

PROMPTS = prompts(12, seed=9, max_len=120)
SAMPLED = prompts(12, seed=19, max_len=40)
TOP_K = 2
SEEDED = {"temperature": 1.0, "top_p": 0.9}


def seeded_outputs(srv):
    jobs = [dict(SEEDED, sampling_seed=100 + i) for i in range(len(SAMPLED))]
    with cf.ThreadPoolExecutor(12) as ex:
        return list(ex.map(lambda a: srv.generate(a[0], 24, **a[1])["output_ids"], zip(SAMPLED, jobs)))


def top_k_sets(plain, prompt, out, k=TOP_K):
    """The plain server's top-k token set at every position of `out` after `prompt`."""

    def at(j):
        r = plain.post(
            "/generate",
            {
                "input_ids": prompt + out[:j],
                "return_logprob": True,
                "top_logprobs_num": k,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            },
        ).json()
        return {t for _, t, _ in r["meta_info"]["output_top_logprobs"][0]}

    with cf.ThreadPoolExecutor(8) as ex:
        return list(ex.map(at, range(len(out))))


@pytest.fixture(scope="module")
def models(pair):
    from sglang_dflash.testing.pairs import MIXED

    return pair("llama", "float32", MIXED["llama"])


@pytest.fixture(scope="module")
def killed(models):
    """A DFLASH server killed mid-load (SIGKILL to every process): its port, process group, and what
    its clients saw. The next server starts on that port with no clean-up."""
    target, drafter = models
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
    return port, left, errors


@pytest.fixture(scope="module")
def injected(models, killed):
    """Restarted on the killed server's port, every 3rd draft step raising: greedy and seeded outputs."""
    target, drafter = models
    # Width pinned to the block: under the cost-aware controller a loaded host can verify at width 1
    # throughout, and then no step drafts at all (the failure path would go untested).
    env = {"SGLANG_DFLASH_DEBUG_FAIL_DRAFT_EVERY": "3", "SGLANG_DFLASH_WIDTH": "16"}
    with launch(target, drafter, "float32", name="dflash-restarted-faults", env=env, port=killed[0]) as srv:
        outs = generate_all(srv, PROMPTS, 32)
        again = generate_all(srv, PROMPTS[:2], 32)
        seeded = seeded_outputs(srv)
        log = srv.log()
    return outs, again, seeded, log


BROKEN = {"nan": float("nan"), "inf": float("inf")}


@pytest.fixture(scope="module")
def broken(models, injected):
    """Servers on a drafter whose final norm is NaN / inf, the width pinned to the block so every step
    drafts from it; then one plain server gives the greedy references and the target's top-k at every
    sampled position (one plain server for the module, after every DFLASH one)."""
    from sglang_dflash.testing.broken_drafter import broken_drafter
    from sglang_dflash.testing.pairs import ROOT

    target, drafter = models
    runs = {}
    jobs = [(p, {"temperature": 1.0, "top_k": TOP_K, "ignore_eos": True}) for p in SAMPLED]
    for name, value in BROKEN.items():
        bad = broken_drafter(drafter, ROOT, value)
        env = {"SGLANG_DFLASH_WIDTH": "16"}
        with launch(target, bad, "float32", name=f"dflash-broken-{name}", env=env, check_drafts=False) as srv:
            greedy = generate_all(srv, PROMPTS, 32)
            seeded = seeded_outputs(srv)
            with cf.ThreadPoolExecutor(12) as ex:
                sampled = list(ex.map(lambda a: srv.generate(a[0], 32, **a[1])["output_ids"], jobs))
            runs[name] = dict(greedy=greedy, seeded=seeded, sampled=sampled, state=dflash_state(srv))
    with launch(target, None, "float32", name="plain-faults") as plain:
        refs = reference(plain, PROMPTS, 32)
        for run in runs.values():
            run["tops"] = [top_k_sets(plain, p, o) for (p, _), o in zip(jobs, run["sampled"])]
    return refs, runs


@pytest.mark.server
def test_killed_mid_load_restarts_clean(killed, injected, broken):
    _, left, errors = killed
    assert not left, f"processes survived the kill: {left}"
    assert errors, "the clients should have seen the server die"
    # the server restarted on the same port (the injected one) served exactly
    assert [o["output_ids"] for o in injected[1]] == [r["output_ids"] for r in broken[0][:2]]


@pytest.mark.server
def test_failing_draft_steps_keep_outputs_exact(injected, broken):
    refs = broken[0]
    outs, again, _, log = injected
    assert_lossless(refs, outs, 1e-4)
    assert [o["output_ids"] for o in again] == [r["output_ids"] for r in refs[:2]]
    assert "injected drafter failure" in log and "decode without a draft" in log
    assert max(o["meta_info"]["spec_accept_length"] for o in outs) > 1.5  # the other steps still speculate


@pytest.mark.server
@pytest.mark.parametrize("name", list(BROKEN))
def test_a_non_finite_drafter_never_changes_a_token(injected, broken, name):
    refs, runs = broken
    run = runs[name]
    assert_lossless(refs, run["greedy"], 1e-4)
    assert run["seeded"] == injected[2], "seeded outputs depend on the drafter"
    tops = run["tops"]
    outside = [(i, j, t) for i, o in enumerate(run["sampled"]) for j, t in enumerate(o) if t not in tops[i][j]]
    assert not outside, f"tokens outside the target's top-{TOP_K} (request, position, token): {outside[:10]}"
    state = run["state"]
    assert state["draft_steps"] > 0 and state["draft_failures"] > 0, state


def generate_all_quiet(srv):
    generate_all(srv, PROMPTS * 4, 400, ignore_eos=True)
