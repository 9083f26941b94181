"""The host facts a bench row needs to be compared with another host's: the CPU's ISA flags, the
memory read bandwidth of one core and of all cores, and the arithmetic peak of the instructions our
GEMMs run (vdpbf16ps where the CPU has AVX512-BF16, AVX2 FMAs), measured by fixed probes.

Why probes: a batch-1 decode step streams every weight once, so the bandwidth bounds it; a verify of
many rows does the arithmetic of all of them, so the peak bounds that (the roofline of a step is
whichever is slower); two hosts with the same `model name` string can differ 2x in either.

The probe (fixed, so rows stay comparable): a 1 GiB float32 buffer (far beyond any L3) summed by
torch, best of 3 reads, on 1 thread and then on every core of this process's affinity mask.
Measured once per boot and CPU model, cached in ~/.cache/sglang_dflash/host_probe.json, so every
bench run does not pay ~2-4 s for it.

    python bench/host_probe.py            # print the facts (measuring if the cache misses)
    python bench/host_probe.py --fresh    # measure again
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "sglang_dflash", "host_probe.json")
PROBE_BYTES = 1 << 30
PROBE_READS = 3
# /proc/cpuinfo flag -> the name rows use; the kernels dispatch on exactly these.
ISA_FLAGS = {
    "avx2": "AVX2",
    "fma": "FMA",
    "avx512f": "AVX512F",
    "avx512bw": "AVX512BW",
    "avx512_vnni": "AVX512_VNNI",
    "avx512_bf16": "AVX512_BF16",
    "amx_tile": "AMX_TILE",
    "amx_bf16": "AMX_BF16",
    "amx_int8": "AMX_INT8",
}


def cpuinfo() -> tuple[str | None, set[str]]:
    """(model name, the flags of the first processor) from /proc/cpuinfo; (None, {}) elsewhere."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                key, _, val = ln.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = val.strip()
                elif key == "flags" and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    return model, flags


def isa(flags: set[str]) -> list[str]:
    """The ISA extensions in ISA_FLAGS this CPU reports, in ISA_FLAGS order."""
    return [name for flag, name in ISA_FLAGS.items() if flag in flags]


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def read_gbs(threads: int, nbytes: int = PROBE_BYTES, reads: int = PROBE_READS) -> float:
    """Best-of-`reads` GB/s of summing an `nbytes` float32 buffer on `threads` torch threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buf = torch.ones(nbytes // 4, dtype=torch.float32)  # written once: every page is resident
        best = float("inf")
        for _ in range(reads):
            t = time.perf_counter()
            buf.sum()
            best = min(best, time.perf_counter() - t)
        return round(nbytes / best / 1e9, 1)
    finally:
        torch.set_num_threads(before)


# 12 independent accumulator chains per thread (more than latency x issue width on any x86 we met),
# registers only: the instruction's throughput on this host, what no GEMM can beat.
PEAK_C = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#define LOOP(T, ZERO, OP) { T acc[12]; for (int i = 0; i < 12; ++i) acc[i] = ZERO; \
  for (long it = 0; it < iters; ++it) { _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) acc[i] = OP; \
    __asm__ volatile("" : "+x"(a)); } \
  float s[16]; for (int i = 1; i < 12; ++i) acc[0] = acc[0] + acc[i]; *(T*)s = acc[0]; sink += s[0]; }
__attribute__((target("avx512f,avx512bf16"))) static float dot(long iters) {
  float sink = 0; __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = a;
  LOOP(__m512, _mm512_setzero_ps(), _mm512_dpbf16_ps(acc[i], a, b)) return sink; }
__attribute__((target("avx2,fma"))) static float fma(long iters) {
  float sink = 0; __m256 a = _mm256_set1_ps(1.f), b = a;
  LOOP(__m256, _mm256_setzero_ps(), _mm256_fmadd_ps(a, b, acc[i])) return sink; }
int main(int argc, char** argv) {  /* argv: dot|fma threads -> GFLOP/s, best of 3 */
  int bf = argv[1][0] == 'd', n = atoi(argv[2]); long iters = 20000000; double best = 0;
  for (int r = 0; r < 3; ++r) { double t = omp_get_wtime(); float sink = 0;
#pragma omp parallel num_threads(n) reduction(+ : sink)
    sink += bf ? dot(iters) : fma(iters);
    t = omp_get_wtime() - t; if (sink == 1.5f) puts("");
    double g = 12.0 * iters * n * (bf ? 64 : 16) / t / 1e9; if (g > best) best = g; }
  printf("%.0f\n", best); }
"""


def peak_gflops(kind: str, threads: int) -> float | None:
    """GFLOP/s of `kind` ('dot': vdpbf16ps on 512 bits, 64 flops; 'fma': 256-bit FMA, 16) on
    `threads` threads, from PEAK_C compiled once into the cache; None where it cannot build."""
    exe = os.path.join(os.path.dirname(CACHE), "peak_probe")
    if not os.path.exists(exe):
        src = exe + ".c"
        os.makedirs(os.path.dirname(CACHE), exist_ok=True)
        with open(src, "w") as f:
            f.write(PEAK_C)
        if subprocess.run(["cc", "-O3", "-fopenmp", src, "-o", exe], capture_output=True).returncode:
            return None
    p = subprocess.run([exe, kind, str(threads)], capture_output=True, text=True, timeout=60)
    return float(p.stdout) if p.returncode == 0 else None


def measure() -> dict:
    n = cores()
    _, flags = cpuinfo()
    out = {
        "read_gbs_1core": read_gbs(1),
        "read_gbs_all": read_gbs(n),
        "read_gbs_threads": n,
        "probe": f"torch float32 sum of {PROBE_BYTES >> 20} MiB, best of {PROBE_READS}",
    }
    for kind, flag in (("dot", "avx512_bf16"), ("fma", "fma")):
        if flag in flags:
            out[f"{kind}_gflops_1core"], out[f"{kind}_gflops_all"] = peak_gflops(kind, 1), peak_gflops(kind, n)
    return out


def bandwidth(fresh: bool = False) -> dict:
    """The probe's numbers for this boot and CPU: from the cache, else measured in a child process
    (so the caller's torch thread settings and memory are untouched) and cached."""
    model, _ = cpuinfo()
    key = f"{boot_id()}|{model}|{cores()}|peak"  # |peak: entries from before the peak probe miss
    if not fresh:
        try:
            with open(CACHE) as f:
                cached = json.load(f)
            if cached.get("key") == key:
                return cached["bandwidth"]
        except (OSError, ValueError, KeyError):
            pass
    try:
        p = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--measure"], capture_output=True, text=True, timeout=120
        )
        got = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr.strip()[-300:]}
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        got = {"error": repr(e)}
    if "error" not in got:
        os.makedirs(os.path.dirname(CACHE), exist_ok=True)
        with open(CACHE + ".tmp", "w") as f:
            json.dump({"key": key, "bandwidth": got}, f)
        os.replace(CACHE + ".tmp", CACHE)
    return got


def facts(fresh: bool = False) -> dict:
    """{cpu, isa, cores, bandwidth}: what provenance.host() adds to every row."""
    model, flags = cpuinfo()
    return {"cpu": model, "isa": isa(flags), "cores": cores(), "bandwidth": bandwidth(fresh)}


def host() -> dict:
    """The machine a row ran on: CPU model and count, ISA flags, memory and its read bandwidth on one
    and on all cores (bench/host_probe.py, cached per boot), GPUs (names), OS."""
    probe = facts()
    try:
        with open("/proc/meminfo") as f:
            mem_gib = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        mem_gib = None
    try:
        q = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        gpus = subprocess.run(q, capture_output=True, text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.TimeoutExpired):
        gpus = []
    return {
        "cpu": probe["cpu"] or platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "cores": probe["cores"],
        "isa": probe["isa"],
        "mem_gib": mem_gib,
        "bandwidth": probe["bandwidth"],
        "gpus": [g for g in gpus if g],
        "os": platform.system(),
    }


if __name__ == "__main__":
    if "--measure" in sys.argv:
        json.dump(measure(), sys.stdout)
    else:
        print(json.dumps(facts(fresh="--fresh" in sys.argv), indent=1))
