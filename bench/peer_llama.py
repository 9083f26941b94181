"""llama.cpp side of bench/peer_bench.py. Runs in the peer venv (llama-cpp-python only, no torch):
reads token-id prompts (JSON list) on stdin, generates up to --max-new tokens greedily for each
(exactly that many unless --eos ids are given: Llama.generate itself never stops at EOS, like
`ignore_eos` on our side), prints per-prompt timings with the build's own report (llama_print_system_info: the ISA
paths it was compiled with) and version, so every row says which llama.cpp it measured."""

import argparse
import json
import sys
import time

import llama_cpp
from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--max-new", type=int, required=True)
    ap.add_argument("--eos", type=int, nargs="*", default=[], help="stop at these token ids (default: never)")
    a = ap.parse_args()
    prompts = json.load(sys.stdin)
    llm = Llama(a.gguf, n_ctx=4096, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)

    def one(ids, n_new):
        t0, first, n = time.perf_counter(), None, 0
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            first = first or time.perf_counter()
            n += 1
            if n >= n_new or int(tok) in a.eos:
                break
        t1 = time.perf_counter()
        return {"tokens": n, "wall_s": t1 - t0, "ttft_s": first - t0}

    one(prompts[0], 8)  # warm-up, as every server arm gets
    outs = [one(ids, a.max_new) for ids in prompts]
    info = llama_cpp.llama_print_system_info()
    info = info.decode() if isinstance(info, bytes) else str(info)
    json.dump({"version": llama_cpp.__version__, "system_info": info.strip(), "outs": outs}, sys.stdout)


if __name__ == "__main__":
    main()
