"""Verify widths (srt/verify_widths.py): each width the controller plays gets its own attention
backend and, where SGLang captures graphs, its own graph runner, swapped in for one verify forward
and back after it; a width whose capture fails verifies eagerly (counted); an unlisted width gets
a backend when first played. Where SGLang's factories raise at start-up (a width's backend, or the
factories themselves), that width is not played, counted, its traceback logged once."""

import contextlib
import types

import pytest

from sglang_dflash.srt import step_profile, verify_widths
from sglang_dflash.srt.verify_widths import VerifyWidths


def runner():
    return types.SimpleNamespace(attn_backend="sglang backend (B)", decode_cuda_graph_runner="sglang graphs (B)")


def factories(fail=()):
    made = {"backends": [], "graphs": []}

    def make_backend(w):
        made["backends"].append(w)
        return f"backend {w}"

    def make_graphs(w, backend):
        assert backend == f"backend {w}", "a width's graphs must capture on that width's own backend"
        if w in fail:
            raise RuntimeError("CUDA out of memory")
        made["graphs"].append(w)
        return f"graphs {w}"

    return made, make_backend, make_graphs


def test_each_width_gets_its_backend_and_graphs_swapped_in_for_one_forward():
    r = runner()
    made, mb, mg = factories(fail=(4,))
    vw = VerifyWidths(r, 16, mb, mg).build([1, 2, 4, 8, 16, 1])
    assert made == {"backends": [1, 2, 4, 8], "graphs": [1, 2, 8]}  # B is SGLang's own
    assert vw.counts == {
        "width 1: captured": 1,
        "width 2: captured": 1,
        "width 4: capture failed": 1,
        "width 8: captured": 1,
    }
    for w, graphs in ((1, "graphs 1"), (4, None), (8, "graphs 8")):
        with vw.at(w):
            assert (r.attn_backend, r.decode_cuda_graph_runner) == (f"backend {w}", graphs)
        assert (r.attn_backend, r.decode_cuda_graph_runner) == ("sglang backend (B)", "sglang graphs (B)")
    # B is SGLang's own, read live: a recapture by SGLang (a PD role switch) is what B verifies with
    r.attn_backend, r.decode_cuda_graph_runner = "recaptured backend", "recaptured graphs"
    with vw.at(16):
        assert (r.attn_backend, r.decode_cuda_graph_runner) == ("recaptured backend", "recaptured graphs")
    with vw.at(8):
        assert r.decode_cuda_graph_runner == "graphs 8"
    assert (r.attn_backend, r.decode_cuda_graph_runner) == ("recaptured backend", "recaptured graphs")


def test_an_unlisted_width_gets_an_eager_backend_once_and_a_failing_forward_restores_sglangs():
    r = runner()
    made, mb, mg = factories()
    vw = VerifyWidths(r, 16, mb, mg).build([1])
    for _ in range(2):
        with vw.at(3):
            assert (r.attn_backend, r.decode_cuda_graph_runner) == ("backend 3", None)
    assert made["backends"] == [1, 3] and made["graphs"] == [1]
    with pytest.raises(ValueError):
        with vw.at(1):
            raise ValueError("forward failed")
    assert (r.attn_backend, r.decode_cuda_graph_runner) == ("sglang backend (B)", "sglang graphs (B)")


def test_graphs_off_builds_backends_only():
    r = runner()
    r.decode_cuda_graph_runner = None
    made, mb, _ = factories()
    vw = VerifyWidths(r, 8, mb, None).build([1, 2, 4, 8])
    assert made == {"backends": [1, 2, 4], "graphs": []} and not vw.counts
    with vw.at(2):
        assert (r.attn_backend, r.decode_cuda_graph_runner) == ("backend 2", None)


# ---- a width whose backend fails at start-up: dropped, counted, logged once, the server builds on ----
class FakeSpec:
    """get_spec(): speculative_num_draft_tokens scoped by override(), as SGLang's config bag does."""

    speculative_num_draft_tokens, speculative_adaptive_config = 8, None

    @contextlib.contextmanager
    def override(self, **kw):
        saved = dict(vars(self))
        vars(self).update(kw)
        try:
            yield
        finally:
            vars(self).clear()
            vars(self).update(saved)


@pytest.fixture
def sglang_fakes(monkeypatch):
    """SGLang's runtime context and graph runner, faked where for_sglang reaches into them; the
    returned runner's attention backend constructor raises for the widths in `broken`."""
    from sglang.srt import runtime_context
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner

    spec = FakeSpec()
    monkeypatch.setattr(runtime_context, "get_spec", lambda: spec)
    monkeypatch.setattr(runtime_context, "get_disagg", lambda: types.SimpleNamespace(enable_pdmux=False))
    overlap = types.SimpleNamespace(enable_two_batch_overlap=False)
    monkeypatch.setattr(runtime_context, "get_exec", lambda: types.SimpleNamespace(overlap=overlap))
    monkeypatch.setattr(
        decode_cuda_graph_runner,
        "DecodeCudaGraphRunner",
        lambda r, attn_backend, speculative_num_draft_tokens: f"graphs {speculative_num_draft_tokens}",
    )
    monkeypatch.setenv("SGLANG_DFLASH_PROFILE", "0")

    def make(broken=(), error=lambda w: AttributeError("'ModelRunner' object has no attribute 'server_args'")):
        r = runner()
        r.init_new_workspace, r.lora_manager = False, None

        def get_attention_backend(init_new_workspace):
            w = spec.speculative_num_draft_tokens
            if w in broken:
                raise error(w)
            return f"backend {w}"

        r._get_attention_backend = get_attention_backend
        return r

    return make


def worker_over(vw, block=8):
    return types.SimpleNamespace(
        block_size=block,
        verify_widths=vw,
        server_args=types.SimpleNamespace(max_running_requests=None),
        model_runner=types.SimpleNamespace(req_to_token_pool=types.SimpleNamespace(size=64)),
    )


def served_stats(vw) -> dict:
    """What /server_info shows (internal_states[i]["dflash"]) for a worker with these verify widths."""
    from sglang_dflash.srt.worker import DFlashWorker

    fake = types.SimpleNamespace(width=None, graphs=None, verify_widths=vw, drafting=None)
    return DFlashWorker.stats(fake)


def tracebacks(caplog):
    return [r for r in caplog.records if r.exc_info]


def test_a_width_whose_backend_fails_is_not_played_counted_and_its_traceback_logged_once(sglang_fakes, caplog):
    r = sglang_fakes(broken=(4,))
    vw = verify_widths.for_sglang(r, 8, [1, 2, 4, 8])
    assert sorted(vw.states) == [1, 2] and vw.failed == {4}
    assert vw.counts["width 4: backend failed"] == 1
    assert vw.counts["width 1: captured"] == vw.counts["width 2: captured"] == 1
    [logged] = tracebacks(caplog)
    assert "verify width 4" in logged.getMessage() and "not played" in logged.getMessage()
    assert served_stats(vw)["verify_graphs"]["width 4: backend failed"] == 1

    worker = worker_over(vw)
    assert step_profile.played_widths(worker) == [1, 2, 8]
    ctl = step_profile.make_controller(worker)
    assert ctl.candidates(1) == [1, 2, 8] and ctl.candidates(64) == [1, 2, 8]
    assert {ctl.choose(bs) for bs in (1, 8, 64)} <= {1, 2, 8}
    with pytest.raises(RuntimeError, match="width 4 has no attention backend"):
        with vw.at(4):
            pass
    assert len(tracebacks(caplog)) == 1 and vw.counts["width 4: backend failed"] == 1  # not retried


def test_a_pinned_width_whose_backend_fails_plays_the_block(sglang_fakes, monkeypatch):
    monkeypatch.setenv("SGLANG_DFLASH_WIDTH", "4")
    vw = verify_widths.for_sglang(sglang_fakes(broken=(4,)), 8, [4])
    ctl = step_profile.make_controller(worker_over(vw))
    assert ctl.mode == "fixed" and ctl.choose(3) == 8


def test_the_widen_margin_is_read_at_start_up_and_a_bad_one_names_the_variable(sglang_fakes, monkeypatch):
    vw = verify_widths.for_sglang(sglang_fakes(), 8, [1, 2, 4, 8])
    assert step_profile.make_controller(worker_over(vw)).widen_margin == 0.0
    monkeypatch.setenv("SGLANG_DFLASH_WIDEN_MARGIN", "0.2")
    assert step_profile.make_controller(worker_over(vw)).widen_margin == 0.2
    for bad, says in (("-0.1", "expected a margin >= 0"), ("lots", "expected a number")):
        monkeypatch.setenv("SGLANG_DFLASH_WIDEN_MARGIN", bad)
        with pytest.raises(ValueError, match=f"SGLANG_DFLASH_WIDEN_MARGIN={bad!r}|SGLANG_DFLASH_WIDEN_MARGIN=-0.1"):
            step_profile.make_controller(worker_over(vw))
        with pytest.raises(ValueError, match=says):
            step_profile.make_controller(worker_over(vw))


def test_one_error_in_every_width_logs_its_traceback_once(sglang_fakes, caplog):
    vw = verify_widths.for_sglang(sglang_fakes(broken=(1, 2, 4)), 8, [1, 2, 4, 8])
    assert vw.failed == {1, 2, 4} and not vw.states
    assert [vw.counts[f"width {w}: backend failed"] for w in (1, 2, 4)] == [1, 1, 1]
    assert len(tracebacks(caplog)) == 1
    assert len([r for r in caplog.records if "backend failed to build" in r.getMessage()]) == 3
    assert step_profile.make_controller(worker_over(vw)).candidates(1) == [8]


def test_factories_that_cannot_be_set_up_leave_only_sglangs_width(sglang_fakes, monkeypatch, caplog):
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner

    monkeypatch.delattr(decode_cuda_graph_runner, "DecodeCudaGraphRunner")  # a renamed internal
    vw = verify_widths.for_sglang(sglang_fakes(), 8, [1, 2, 4, 8])
    assert vw.failed == {1, 2, 4} and vw.counts == {"setup failed": 1}
    assert len(tracebacks(caplog)) == 1
    worker = worker_over(vw)
    assert step_profile.played_widths(worker) == [8]
    assert step_profile.make_controller(worker).candidates(1) == [8]
