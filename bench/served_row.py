"""One measured row of a served bench: requests streamed through c clients against a running
server, with its DFLASH metrics (accept lengths, verify widths, stage seconds) read before and after.
Used by real_bench.py and peer_bench.py."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import provenance  # noqa: E402
from sglang_dflash.srt.metrics import STAGES  # noqa: E402
from sglang_dflash.srt.request_check import MAX_WIDTH  # noqa: E402


def stream_one(
    url: str, ids: list[int], max_new: int, temperature: float, seed: int | None, ignore_eos: bool = False, cap=None
) -> dict:
    """One streamed request; cap: its verify-width cap (custom_params.dflash_max_width), None: none."""
    sp = {"max_new_tokens": max_new, "temperature": temperature, "ignore_eos": ignore_eos}
    if cap is not None:
        sp["custom_params"] = {MAX_WIDTH: cap}
    if temperature > 0 and seed is not None:
        sp["sampling_seed"] = seed
    t0 = time.perf_counter()
    times, meta = [], {}
    with requests.post(
        url + "/generate", json={"input_ids": ids, "sampling_params": sp, "stream": True}, stream=True, timeout=1800
    ) as r:
        r.raise_for_status()
        seen = 0
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            meta = json.loads(line[6:])["meta_info"]
            new = meta["completion_tokens"] - seen
            if new > 0:
                times.append((time.perf_counter(), new))
                seen = meta["completion_tokens"]
    ttft = times[0][0] - t0 if times else float("nan")
    gaps = [(b[0] - a[0]) / b[1] for a, b in zip(times, times[1:])]  # per token, chunks may hold several
    return {"meta": meta, "ttft": ttft, "itl": gaps}


def accept_hist(url: str) -> tuple[dict[int, float], dict[str, float], dict[int, float]]:
    """Cumulative sglang:dflash_accept_length bucket counts {le: count}, stage seconds {stage: s} and
    cumulative sglang:dflash_verify_width bucket counts {le: steps}."""
    out, stages, widths = {}, {}, {}
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        for name, into in (("sglang:dflash_accept_length_bucket", out), ("sglang:dflash_verify_width_bucket", widths)):
            if line.startswith(name):
                le = line.split('le="')[1].split('"')[0]
                if le != "+Inf":
                    into[int(float(le))] = into.get(int(float(le)), 0) + float(line.split()[-1])
        for stage in STAGES:
            if line.startswith(f"sglang:dflash_{stage}_seconds_sum"):
                stages[stage] = stages.get(stage, 0.0) + float(line.split()[-1])
    return out, stages, widths


def per_bucket(before: dict, after: dict) -> dict:
    """Cumulative bucket counts at two times -> counts per bucket in between."""
    cum = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(after)}
    return {k: cum[k] - cum.get(k - 1, 0) for k in cum}


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


def run(srv, batch, conc, max_new, temp, seeded=True, ignore_eos=False, cap=None, first=0):
    """One measured row on a warm server whose prefix cache is flushed first (cap: every request's
    verify-width cap, 1 = the same server decoding plainly; first: the first request's index in its
    row, which seeds it)."""
    seed = (lambda i: first + i) if seeded else (lambda i: None)
    provenance.flush_cache(srv.url)
    before, st0, w0 = accept_hist(srv.url)
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(conc) as ex:
        outs = list(
            ex.map(lambda a: stream_one(srv.url, a[1], max_new, temp, seed(a[0]), ignore_eos, cap), enumerate(batch))
        )
    wall = time.perf_counter() - t
    after, st1, w1 = accept_hist(srv.url)
    metas = [o["meta"] for o in outs]
    return {
        "concurrency": conc,
        "temperature": temp,
        "seeded": seeded,
        "requests": len(outs),
        "metas": metas,
        "tok_s": sum(m.get("completion_tokens", 0) for m in metas) / wall,
        "wall_s": wall,
        "hist": per_bucket(before, after),
        "widths": per_bucket(w0, w1),
        "stage_s": {k: st1[k] - st0.get(k, 0.0) for k in st1},
        "ttft": [o["ttft"] for o in outs],
        "itl": [g for o in outs for g in o["itl"]],
    }


def run_pair(srv, batch, conc, max_new, temp, seeded, ignore_eos, chunks: int, flip: bool):
    """A row as is and capped at width 1 on one server, interleaved: the batch in `chunks` parts, each
    run both ways in ABBA order (flip: start with the capped one), so the host's drift between
    minutes loads both alike. -> (the row as is, the row capped), each merged over its parts."""
    size = -(-len(batch) // chunks)
    parts: dict = {None: [], 1: []}
    for i in range(0, len(batch), size):
        caps = [None, 1] if (i // size + flip) % 2 == 0 else [1, None]
        for cap in caps:
            parts[cap].append(run(srv, batch[i : i + size], conc, max_new, temp, seeded, ignore_eos, cap, first=i))
    return merge(parts[None]), merge(parts[1])


def merge(runs: list[dict]) -> dict:
    """Parts of one row -> the row: tokens over the summed wall time, counts and samples pooled."""
    out = dict(runs[0], metas=[m for r in runs for m in r["metas"]], wall_s=sum(r["wall_s"] for r in runs))
    out["requests"] = len(out["metas"])
    out["tok_s"] = sum(m.get("completion_tokens", 0) for m in out["metas"]) / out["wall_s"]
    for key in ("hist", "widths", "stage_s"):
        out[key] = {k: sum(r[key].get(k, 0) for r in runs) for k in {k for r in runs for k in r[key]}}
    for key in ("ttft", "itl"):
        out[key] = [x for r in runs for x in r[key]]
    return out


def warm_up(srv, batch, temps):
    """Identical for every arm and repeat, excluded from the numbers."""
    for temp in temps:
        run(srv, batch[:2], 2, 8, temp)
