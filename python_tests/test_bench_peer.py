"""bench/peer_bench.py's decisions on fake rows (no llama.cpp, no server): when the cached llama.cpp
build is rebuilt, which arms pair at equal threads, and the equal-threads table."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import peer_bench  # noqa: E402
import provenance  # noqa: E402
from results_cpu import equal_threads_table  # noqa: E402

WANT = {"llama_cpp_python": "0.3.36", "cmake_args": "-DGGML_NATIVE=ON", "cpu_flags": ["avx2", "avx512f", "fma"]}


def test_a_build_is_reused_only_for_the_same_version_flags_and_cpu():
    assert peer_bench.rebuild_reason(dict(WANT, build_s=300, cpu="x"), WANT) is None
    assert "no recorded build" in peer_bench.rebuild_reason(None, WANT)
    assert "llama_cpp_python" in peer_bench.rebuild_reason(dict(WANT, llama_cpp_python="0.3.20"), WANT)
    assert "cmake_args" in peer_bench.rebuild_reason(dict(WANT, cmake_args="-DGGML_NATIVE=OFF"), WANT)
    # built on a CPU with AMX, run on one without: the native build may use AMX, so rebuild
    amx = dict(WANT, cpu_flags=[*WANT["cpu_flags"], "amx_tile"])
    assert "lacks ['amx_tile']" in peer_bench.rebuild_reason(amx, WANT)
    assert "adds ['avx2']" in peer_bench.rebuild_reason(dict(WANT, cpu_flags=["avx512f", "fma"]), WANT)


def test_the_wanted_build_names_this_cpu():
    want = peer_bench.wanted_build()
    assert want["cmake_args"] == peer_bench.CMAKE_ARGS and "GGML_NATIVE=ON" in want["cmake_args"]
    assert set(want["isa"]) <= set(peer_bench.host_probe.ISA_FLAGS.values())


def fake_runs():
    tok = {"llama.cpp-bf16-t1": (20.0, 25.0), "llama.cpp-bf16-t2": (40.0, 40.0)}
    tok |= {
        "adaptive-t1": (30.0, 25.0),
        "adaptive-t2": (60.0, 80.0),
        "adaptive": (62.0, 78.0),
        "adaptive-t4": (9.0, 9.0),
    }
    return [
        {"config": arm, "repeat": rep, "tok_s": tok[arm][rep]}
        for rep in (0, 1)
        for arm in provenance.arm_order(list(tok), rep)
    ]


def test_equal_threads_pairs_each_arm_with_llama_on_as_many_threads():
    assert peer_bench.threads_of("adaptive-t1", 2) == 1 and peer_bench.threads_of("adaptive", 2) == 2
    assert peer_bench.threads_of("llama.cpp-bf16-t2", 8) == 2
    got = peer_bench.equal_thread_ratios(fake_runs(), default=2)
    assert got["adaptive-t1"] == pytest.approx([1.5, 1.0])  # 30/20, 25/25: paired per repeat
    assert got["adaptive-t2"] == pytest.approx([1.5, 2.0])
    assert got["adaptive"] == pytest.approx([1.55, 1.95])  # the default (2 cores) against llama t2
    assert "llama.cpp-bf16-t1" not in got and "adaptive-t4" not in got
    # on a 4-core host the default has no llama.cpp arm on 4 threads: no ratio rather than a wrong one
    assert "adaptive" not in peer_bench.equal_thread_ratios(fake_runs(), default=4)


def test_equal_threads_table_puts_equal_threads_first_and_the_default_beside():
    runs, rows = fake_runs(), []
    equal = peer_bench.equal_thread_ratios(runs, 2)
    for arm in dict.fromkeys(r["config"] for r in runs):
        rs = [r["tok_s"] for r in runs if r["config"] == arm]
        row = {"config": arm, "threads": peer_bench.threads_of(arm, 2), **provenance.spread("tok_s", rs)}
        if arm in equal:
            row.update(provenance.spread("vs_llama_equal_threads", equal[arm]))
        rows.append(row)
    lines = equal_threads_table(rows)
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    assert [b[:2] for b in body] == [["1", "adaptive-t1"], ["2", "adaptive-t2"], ["2", "adaptive (our default)"]]
    assert body[0][3] == "22.5 (20.0-25.0)" and body[0][4] == "1.25x (1.00-1.50)"
    assert all("adaptive-t4" not in ln for ln in lines)  # no llama.cpp on 4 threads: not in the table
