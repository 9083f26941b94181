"""Scale-out layouts side by side in one run: which one should a CPU user pick?

On the embedded model (bf16), plain and DFLASH (adaptive) each in three layouts of the same cores:
`one` (one server, its forward on all cores: the default, cpu/cpu_threads.py), `dp` (one server, --dp-size N: SGLang's
data-parallel controller, one thread per rank) and `smg` (N single-thread servers behind SMG,
sglang_dflash/replicas.py's router flags), at concurrency 8 / 16 / 32, temperature 0, the held-out
prompts of real_bench. Output tokens per second over the wall clock of each row; rows appended to
bench/results/scale_out.jsonl (a new run, named by date and commit).

python bench/scale_out_bench.py [--layouts one dp smg] [--concurrency 8 16 32] [--requests 32]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import os
import subprocess
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402
from real_bench import heldout_prompts  # noqa: E402
from sglang_dflash.launch import cpu_binding  # noqa: E402
from sglang_dflash.replicas import router_cmd, wait_workers, worker_env  # noqa: E402
from sglang_dflash.testing.servers import free_port, launch, stop  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "scale_out.jsonl")


@contextlib.contextmanager
def layout(name, model, draft, n, extra):
    cores = os.cpu_count() or 1
    if name == "one":
        with launch(model, draft, "bfloat16", extra=extra, name="scale-one") as s:
            yield s.url, [s.url]
    elif name == "dp":  # plain runs sglang.launch_server directly: give both arms the rank binding
        env = {"SGLANG_CPU_OMP_THREADS_BIND": cpu_binding(n, cores)}
        with launch(model, draft, "bfloat16", extra=[*extra, "--dp-size", str(n)], env=env, name="scale-dp") as s:
            yield s.url, [s.url]
    else:
        with contextlib.ExitStack() as stack:
            workers = [
                stack.enter_context(
                    launch(model, draft, "bfloat16", extra=extra, env=worker_env(i, n), name=f"scale-w{i}")
                )
                for i in range(n)
            ]
            port = free_port()
            proc = subprocess.Popen(
                router_cmd([w.url for w in workers], "127.0.0.1", port, free_port()), start_new_session=True
            )
            try:
                wait_workers(f"http://127.0.0.1:{port}", n, [proc], timeout=60)
                yield f"http://127.0.0.1:{port}", [w.url for w in workers]
            finally:
                stop(proc)


def measure(url, flush, batch, conc, max_new):
    """Output tokens/s of one row, every server's prefix cache flushed first."""
    for u in flush:
        provenance.flush_cache(u)
    body = lambda ids: {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0}}  # noqa: E731
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(conc) as ex:
        outs = list(ex.map(lambda ids: requests.post(url + "/generate", json=body(ids), timeout=900).json(), batch))
    wall = time.perf_counter() - t
    return sum(o["meta_info"]["completion_tokens"] for o in outs) / wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", nargs="+", default=["one", "dp", "smg"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--replicas", type=int, default=2)
    a = ap.parse_args()
    prov = provenance.stamp()
    from transformers import AutoTokenizer

    from sglang_dflash.drafters import shipped_drafter
    from sglang_dflash.embedded import derive

    model, draft = derive(), shipped_drafter()
    batch = heldout_prompts(AutoTokenizer.from_pretrained(model), a.requests)
    extra = ["--disable-overlap-schedule", "--max-running-requests", "48"]  # what DFLASH forces, for both arms
    rows = []
    try:  # a layout that fails to start still leaves the rows measured before it
        for lay in a.layouts:
            for arm, d in (("plain", None), ("dflash", draft)):
                with layout(lay, model, d, a.replicas, extra) as (url, flush):
                    measure(url, flush, batch[:2], 2, 8)  # warm-up, excluded
                    for conc in a.concurrency:
                        tok_s = measure(url, flush, batch, conc, a.max_new_tokens)
                        rows.append({"layout": lay, "arm": arm, "concurrency": conc, "tok_s": round(tok_s, 1)})
                        print(rows[-1], flush=True)
    finally:
        save(rows, prov, a)


def save(rows, prov, a):
    if not rows:
        return
    run = provenance.append_rows(
        RESULTS,
        [
            dict(
                r,
                replicas=a.replicas,
                max_new_tokens=a.max_new_tokens,
                requests=a.requests,
                **provenance.base_fields(prov),
            )
            for r in rows
        ],
        prov,
    )
    print(f"scale_out_bench: run {run} -> {RESULTS}")
    for conc in a.concurrency:
        cells = {(r["layout"], r["arm"]): r["tok_s"] for r in rows if r["concurrency"] == conc}
        print(f"c={conc}: " + ", ".join(f"{k[0]}/{k[1]} {v}" for k, v in sorted(cells.items())))


if __name__ == "__main__":
    main()
