"""Finishing inside a block, aborts, and the radix (prefix) cache, on the mixed-acceptance pair."""

import json
import os
import threading
import time

import pytest
import requests
import torch

from sglang_dflash.srt.metrics import STAGES
from sglang_dflash.testing.servers import launch, penalty_cases, prompts

SAMPLES = prompts(6, seed=3, max_len=40)
LOGPROB_SAMPLING = {"max_new_tokens": 24, "temperature": 0}
LOGPROB_BODY = dict(input_ids=SAMPLES[2], return_logprob=True, top_logprobs_num=2, sampling_params=LOGPROB_SAMPLING)
PENALTY_FIRST_ACCEPT = 0.1  # measured 0.18 (108 of 589 blocks); a drafter never right gives ~0


def stop_cases(ref_outputs):
    """Limits that land mid-block: a stop token id / stop string seen mid-output, max_new_tokens.
    The drafter always proposes the steer token 42, so a stop on 42 lands on an accepted draft and
    a stop on any other token lands on a target (bonus or rejection) token: both are covered."""
    cases = []
    for p, out in zip(SAMPLES, ref_outputs):
        cut = next((t for t in out["output_ids"][3:] if t != 42), None)
        if cut is not None:
            cases.append((p, {"stop_token_ids": [cut]}))
            cases.append((p, {"stop": [out["text"][5:8]] if len(out["text"]) > 8 else ["H"]}))
        if 42 in out["output_ids"][1:]:  # output position >= 1: emitted as an accepted draft
            cases.append((p, {"stop_token_ids": [42]}))
        for n in (1, 2, 7, 17, 33):
            cases.append((p, {"max_new_tokens": n}))
    return cases


def run_case(srv, p, params):
    sp = {"max_new_tokens": 48, "temperature": 0, **params}
    return requests.post(srv.url + "/generate", json={"input_ids": p, "sampling_params": sp}, timeout=600).json()


@pytest.fixture(scope="module")
def mixed(pair, tmp_path_factory):
    from sglang_dflash.testing.pairs import MIXED

    target, drafter = pair("llama", "float32", MIXED["llama"])
    # Penalties: plain decoding counts every output token only without overlap scheduling (SGLang's
    # overlap scheduler counts them one step late), and DFLASH runs without overlap; compare with that.
    with launch(target, None, "float32", name="plain-stops", extra=["--disable-overlap-schedule"]) as plain:
        base = [run_case(plain, p, {}) for p in SAMPLES]
        lp_want = requests.post(plain.url + "/generate", json=LOGPROB_BODY, timeout=600).json()
        cases = stop_cases(base)
        want = [run_case(plain, p, c) for p, c in cases]
        pen_want = [run_case(plain, p, c) for p, c in penalty_cases(SAMPLES)]
    dump = tmp_path_factory.mktemp("kvdump")
    with launch(
        target,
        drafter,
        "float32",
        name="dflash-serving",
        extra=["--enable-metrics", "--enable-custom-logit-processor"],  # such requests reach our refusal
        env={"SGLANG_DFLASH_DEBUG_DUMP_DIR": str(dump)},
    ) as srv:
        yield srv, cases, want, dump, (base, pen_want, lp_want)


@pytest.mark.server
def test_finish_inside_block_matches_plain(mixed):
    srv, cases, want, *_ = mixed
    assert len(cases) >= 30
    on_drafts = [
        c
        for (_, c), w in zip(cases, want)
        if c.get("stop_token_ids") == [42] and w["meta_info"]["finish_reason"].get("matched") == 42
    ]
    assert len(on_drafts) >= 2, "too few cases stop on an accepted draft"
    for (p, c), w in zip(cases, want):
        got = run_case(srv, p, c)
        assert got["output_ids"] == w["output_ids"], c
        assert got["meta_info"]["finish_reason"] == w["meta_info"]["finish_reason"], c
        assert got["meta_info"]["completion_tokens"] == len(w["output_ids"])


@pytest.mark.server
def test_penalties_inside_blocks_match_plain(mixed):
    """Frequency/presence/repetition penalties, min_new_tokens and logit_bias, exact under DFLASH:
    the drafter keeps proposing the steer token, so in-block counts decide the outcome."""
    srv, *_, (base, pen_want, _) = mixed
    cases = penalty_cases(SAMPLES)
    changed = 0
    before = scrape(srv)
    for (p, c), w in zip(cases, pen_want):
        got = run_case(srv, p, c)
        assert got["output_ids"] == w["output_ids"], c
        assert got["meta_info"]["finish_reason"] == w["meta_info"]["finish_reason"], c
        changed += w["output_ids"] != base[SAMPLES.index(p)]["output_ids"]
    assert changed >= len(cases) // 2, "the penalties should change most outputs"
    time.sleep(1)
    after = scrape(srv)
    # Per drafted block, not per step: how often the controller drafts depends on the start-up cost
    # profile (machine load), while whether the first draft survives the penalties does not.
    drafts = after["sglang:dflash_drafts_total"] - before.get("sglang:dflash_drafts_total", 0)
    key = "sglang:dflash_accepted_tokens_total{position=1}"
    first = after.get(key, 0) - before.get(key, 0)
    print(
        f"penalized requests: {changed}/{len(cases)} changed, first draft accepted in {first:.0f}/{drafts:.0f} blocks"
    )
    assert drafts > 0 and first / drafts > PENALTY_FIRST_ACCEPT, "drafts should still be accepted with penalties"


@pytest.mark.server
def test_abort_frees_every_slot(mixed):
    """Abort four running requests. Each abort is sent once its request has streamed a chunk (so it
    is running in the scheduler), not after a fixed sleep: a fast host finished the long requests
    before a timed abort arrived (CI, stop 29)."""
    srv = mixed[0]
    long = {"max_new_tokens": 1900, "temperature": 0, "ignore_eos": True}
    results, running = {}, [threading.Event() for _ in range(4)]

    def go(i):
        body = {"input_ids": SAMPLES[i % len(SAMPLES)], "rid": f"abort-{i}", "sampling_params": long, "stream": True}
        with requests.post(srv.url + "/generate", json=body, stream=True, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    results[i] = json.loads(line[5:])
                    running[i].set()
        running[i].set()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for i in range(4):
        assert running[i].wait(120), f"request {i} never streamed"
        requests.post(srv.url + "/abort_request", json={"rid": f"abort-{i}"}, timeout=30)
    for t in threads:
        t.join(120)
    reasons = [r["meta_info"]["finish_reason"]["type"] for r in results.values()]
    assert len(reasons) == 4 and reasons.count("abort") >= 3, reasons
    assert all(
        r["meta_info"]["completion_tokens"] < 1900
        for r in results.values()
        if r["meta_info"]["finish_reason"]["type"] == "abort"
    )
    # SGLang's strict idle check (on by default) raises inside the scheduler on any leaked slot.
    time.sleep(5)
    assert requests.get(srv.url + "/health_generate", timeout=60).status_code == 200
    assert "leak" not in srv.log().lower()
    # flush_cache is refused while any request is running or queued: the aborted ones are gone
    assert any(
        requests.post(srv.url + "/flush_cache", timeout=60).status_code == 200
        for _ in range(50)
        if time.sleep(0.2) is None
    )


@pytest.mark.server
def test_prefix_cache_same_tokens_and_same_draft_kv(mixed):
    srv, _, _, dump, _ = mixed
    prefix = prompts(4, seed=11, max_len=200)[3]  # the 200-token one
    a, b = prefix + [5, 6, 7], prefix + [9, 10]

    def gen(ids, rid):
        body = {"input_ids": ids, "rid": rid, "sampling_params": {"max_new_tokens": 32, "temperature": 0}}
        return requests.post(srv.url + "/generate", json=body, timeout=600).json()

    requests.post(srv.url + "/flush_cache", timeout=60)
    gen(a, "pc-a")
    warm = gen(b, "pc-b-warm")
    again = gen(a, "pc-a-again")
    assert warm["meta_info"]["cached_tokens"] >= 200 and again["meta_info"]["cached_tokens"] >= 200
    time.sleep(1)
    assert requests.post(srv.url + "/flush_cache", timeout=60).status_code == 200
    cold = gen(b, "pc-b-cold")
    assert cold["meta_info"]["cached_tokens"] == 0
    assert warm["output_ids"] == cold["output_ids"]
    # Acceptance lengths are not compared: the adaptive controller picks widths from the acceptance
    # history of every request served before, so warm and cold may verify at different widths.
    w, c = (torch.load(os.path.join(dump, f"pc-b-{k}.pt")) for k in ("warm", "cold"))
    assert w["k"].shape == c["k"].shape and w["k"].shape[1] == len(b)
    # Rows of the cached prefix were written by request A's prefill; they must equal a cold prefill's.
    torch.testing.assert_close(w["k"], c["k"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w["v"], c["v"], rtol=1e-5, atol=1e-5)
    assert gen(a, "pc-a-3")["output_ids"] == again["output_ids"]


def scrape(srv):
    from prometheus_client.parser import text_string_to_metric_families

    vals = {}
    for fam in text_string_to_metric_families(requests.get(srv.url + "/metrics", timeout=30).text):
        for smp in fam.samples:
            if smp.name.startswith("sglang:dflash"):
                key = smp.name + ("{position=%s}" % smp.labels["position"] if "position" in smp.labels else "")
                key += '{le="%s"}' % smp.labels["le"] if "le" in smp.labels else ""
                key += "{width=%s}" % smp.labels["width"] if "width" in smp.labels else ""
                vals[key] = vals.get(key, 0.0) + smp.value
            assert "model_name" in smp.labels or not smp.name.startswith("sglang:dflash")
    return vals


@pytest.mark.server
def test_dflash_metrics_match_meta_info(mixed):
    srv = mixed[0]
    before = scrape(srv)
    outs = [run_case(srv, p, {"max_new_tokens": 40}) for p in SAMPLES]
    time.sleep(1)
    after = scrape(srv)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    metas = [o["meta_info"] for o in outs]
    verify = sum(m["spec_verify_ct"] for m in metas)
    # requests ran one at a time: one request per step, one width observation per verify step
    assert d["sglang:dflash_verify_width_count"] == verify
    plain_steps = d['sglang:dflash_verify_width_bucket{le="1.0"}']  # width 1: no draft
    drafted = verify - plain_steps
    assert drafted > 0, "the controller never speculated on the mixed pair"
    assert d["sglang:dflash_drafts_total"] == drafted
    assert d["sglang:dflash_draft_tokens_total"] == d["sglang:dflash_verify_width_sum"] - verify
    per_pos = [d.get("sglang:dflash_accepted_tokens_total{position=%d}" % j, 0) for j in range(1, 16)]
    assert sum(per_pos) == sum(m["spec_num_correct_drafts"] for m in metas)
    assert per_pos == sorted(per_pos, reverse=True) and per_pos[0] > 0
    assert d["sglang:dflash_accept_length_count"] == drafted
    assert d["sglang:dflash_accept_length_sum"] == sum(m["completion_tokens"] - 1 for m in metas) - plain_steps
    rates = [v for k, v in after.items() if k.startswith("sglang:dflash_expected_tokens_per_second{width=")]
    assert len(rates) == 5 and all(r > 0 for r in rates), rates  # one gauge per candidate width
    for stage in STAGES:  # requests ran one at a time: one step per verify
        assert d[f"sglang:dflash_{stage}_seconds_count"] == verify


@pytest.mark.server
def test_greedy_exact_and_seeded_reproducible_in_a_sampling_batch(mixed):
    import concurrent.futures as cf

    srv, cases, want, *_ = mixed
    greedy = list(zip(cases, want))[:12]
    sampled = [(p, {"temperature": 1.0, "top_p": 0.9, "sampling_seed": 1000 + i}) for i, p in enumerate(SAMPLES)]
    jobs = [c for c, _ in greedy] + sampled + sampled
    with cf.ThreadPoolExecutor(len(jobs)) as ex:
        outs = list(ex.map(lambda c: run_case(srv, *c), jobs))
    for (c, w), o in zip(greedy, outs):
        assert o["output_ids"] == w["output_ids"], c
    first, second = outs[len(greedy) : len(greedy) + len(sampled)], outs[len(greedy) + len(sampled) :]
    for a, b in zip(first, second):
        assert a["output_ids"] == b["output_ids"]
    # one prompt, different seeds: the seed must matter (different prompts would differ anyway)
    reseeded = [
        run_case(srv, SAMPLES[0], {"temperature": 1.0, "top_p": 0.9, "sampling_seed": s})["output_ids"]
        for s in range(2000, 2006)
    ]
    assert len({tuple(o) for o in reseeded}) >= 4, reseeded


@pytest.mark.server
def test_logprobs_match_plain(mixed):
    srv, *_, (_, _, want) = mixed
    o = requests.post(srv.url + "/generate", json=LOGPROB_BODY, timeout=600).json()
    lps, tops = o["meta_info"]["output_token_logprobs"], o["meta_info"]["output_top_logprobs"]
    assert len(lps) == len(o["output_ids"]) == 24 and o["meta_info"]["spec_verify_ct"] < 24
    assert o["output_ids"] == want["output_ids"]
    w_lps, w_tops = want["meta_info"]["output_token_logprobs"], want["meta_info"]["output_top_logprobs"]
    for (lp, tok, _), top, (w_lp, w_tok, _), w_top in zip(lps, tops, w_lps, w_tops):
        # verify (B rows at once) and decode round differently in float32: ~1e-6
        assert tok == w_tok and abs(lp - w_lp) < 1e-4, (lp, w_lp)
        assert [t[1] for t in top] == [t[1] for t in w_top]
        assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(top, w_top))


@pytest.mark.server
def test_unsupported_sampling_features_are_refused_clearly(mixed):
    srv = mixed[0]
    from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

    install_cpu_shims()  # without a GPU, SGLang's module-level sgl_kernel imports need these stand-ins
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    # Grammars are served (test_structured.py); watermarks need --device cuda in SGLang itself.
    proc = DisallowedTokensLogitsProcessor().to_str()
    body = {"input_ids": SAMPLES[1], "sampling_params": {"max_new_tokens": 8}, "custom_logit_processor": proc}
    r = requests.post(srv.url + "/generate", json=body, timeout=120)
    text = r.text
    assert 400 <= r.status_code < 500, (r.status_code, text[:300])
    assert "sglang_dflash" in text and "custom_logit_processor" in text, (r.status_code, text[:300])
    ok = run_case(srv, SAMPLES[1], {"max_new_tokens": 8})  # the server keeps serving
    assert len(ok["output_ids"]) == 8


@pytest.mark.server
def test_cpu_subprocesses_are_forked_not_spawned(mixed):
    """cpu/fork_start.py: on CPU the scheduler and detokenizer are forked from the launching process
    (a spawned child runs `multiprocessing.spawn`'s entry point and re-imports SGLang)."""
    import psutil

    srv = mixed[0]
    children = psutil.Process(srv.proc.pid).children(recursive=True)
    cmdlines = [" ".join(c.cmdline()) for c in children]
    assert len(children) >= 2, cmdlines
    assert not [c for c in cmdlines if "multiprocessing" in c], cmdlines
