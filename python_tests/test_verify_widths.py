"""Verify widths (srt/verify_widths.py): each width the controller plays gets its own attention
backend and, where SGLang captures graphs, its own graph runner, swapped in for one verify forward
and back after it; a width whose capture fails verifies eagerly (counted); an unlisted width gets
a backend when first played."""

import types

import pytest

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
