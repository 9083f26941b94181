"""Batched offline inference with DFLASH through `sglang.Engine`.

python -m sglang_dflash.offline --input prompts.jsonl --output results.jsonl [--model M [--draft D]]

With no --model: the embedded SmolLM2 and its shipped drafter (the pair `make serve` serves); with
--model and no --draft, or --draft none: plain decoding.

Input lines: {"id": ..., "prompt": "..."} or {"id": ..., "messages": [...]}, optional "sampling_params"
overrides. Results are appended as each batch completes, so a rerun resumes by skipping ids already
written; a malformed or failing line is written with an "error" field and never stops the run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from sglang_dflash.resumable_jsonl import append_rows, done_ids


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="target HF folder or hub id (default: the embedded SmolLM2)")
    ap.add_argument(
        "--draft",
        help="DFlash drafter checkpoint; default: the shipped drafter for the embedded target, none for --model",
    )
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=-1)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--chat", action="store_true", help="apply the model's chat template to 'prompt' lines too")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--block-size", type=int, default=None)
    return ap.parse_args(argv)


def resolve_pair(a) -> None:
    """Fills a.model / a.draft: the embedded pair when --model is absent (the drafter only where
    --draft is absent too); `--draft none` decodes without speculation."""
    if a.model is None:
        from sglang_dflash.embedded import derive

        a.model = derive()
        if a.draft is None:
            from sglang_dflash.drafters import shipped_drafter

            a.draft = shipped_drafter()
    if a.draft is not None and a.draft.lower() == "none":
        a.draft = None


def read_jobs(path: str, done: set):
    """Yield (job or None, error or None, raw) for every line whose id is not in `done`."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            job = None
            try:
                job = json.loads(line)
                if not isinstance(job, dict) or "id" not in job:
                    raise ValueError("line must be a JSON object with an 'id'")
                if ("prompt" in job) == ("messages" in job):
                    raise ValueError("line needs exactly one of 'prompt' or 'messages'")
                if not isinstance(job.get("sampling_params", {}), dict):
                    raise ValueError("'sampling_params' must be an object")
            except (json.JSONDecodeError, ValueError) as e:
                bad_id = job.get("id", f"line-{n}") if isinstance(job, dict) else f"line-{n}"
                if bad_id not in done:
                    yield None, f"line {n}: {e}", {"id": bad_id}
                continue
            if job["id"] not in done:
                yield job, None, job


def engine_kwargs(a) -> dict:
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    kw = dict(model_path=a.model, tp_size=a.tp, device=device, dtype=a.dtype, log_level="warning")
    if a.draft:
        kw.update(speculative_algorithm="DFLASH", speculative_draft_model_path=a.draft)
        if a.block_size:
            kw["speculative_num_draft_tokens"] = a.block_size
    if device == "cpu":
        from sglang_dflash.cpu_serving import engine_kwargs as cpu_kwargs, set_cpu_env

        set_cpu_env()
        kw.update(cpu_kwargs())
    return kw


def main(argv=None):
    a = parse_args(argv)
    resolve_pair(a)
    import threading

    from tqdm import tqdm

    # The bar's lock is a thread lock: tqdm's default adds a multiprocessing lock, which under the
    # spawn start method SGLang's Engine sets registers a semaphore with multiprocessing's resource
    # tracker; Engine.shutdown kills every child process, the tracker too, so that semaphore's
    # release at exit would relaunch a tracker that does not know it and print a traceback.
    tqdm.set_lock(threading.RLock())

    from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

    install_cpu_shims()  # before sglang.Engine is touched (no-op where sgl_kernel loads)
    import sglang
    from transformers import AutoTokenizer

    done = done_ids(a.output)  # a torn last line is dropped: its job is redone
    jobs = list(read_jobs(a.input, done))
    tok = AutoTokenizer.from_pretrained(a.model)
    engine = sglang.Engine(**engine_kwargs(a))
    try:
        return _run(a, engine, tok, jobs, done)
    finally:
        engine.shutdown()  # its scheduler processes go with it, on an error too


def _run(a, engine, tok, jobs, done) -> dict:
    base = {
        "max_new_tokens": a.max_new_tokens,
        "temperature": a.temperature,
        "top_p": a.top_p,
        "top_k": a.top_k,
        **({"sampling_seed": a.seed} if a.seed is not None else {}),
    }
    from tqdm import tqdm

    stats = {"requests": 0, "errors": 0, "tokens": 0, "verify": 0, "skipped": len(done)}
    t0 = time.time()
    bar = tqdm(total=len(jobs), unit="req", desc="dflash")
    with append_rows(a.output) as write:

        def emit(rec):
            write(rec)
            stats["requests"] += 1
            stats["errors"] += "error" in rec
            bar.update(1)
            el = time.time() - t0
            tau = stats["tokens"] / max(stats["verify"], 1)
            bar.set_postfix(tok_s=f"{stats['tokens'] / max(el, 1e-9):.1f}", tau=f"{tau:.2f}", errors=stats["errors"])

        for i in range(0, len(jobs), a.batch_size):
            chunk = jobs[i : i + a.batch_size]
            for job, err, raw in chunk:
                if err:
                    emit({"id": raw["id"], "error": err})
            good = [j for j, err, _ in chunk if not err]
            for job, res in zip(good, run_batch(engine, tok, good, base, a.chat)):
                if "error" not in res:
                    meta = res.pop("meta")
                    stats["tokens"] += meta.get("completion_tokens", 0)
                    stats["verify"] += meta.get("spec_verify_ct", meta.get("completion_tokens", 0))
                emit({"id": job["id"], **res})
    bar.close()
    wall = time.time() - t0
    summary = {
        **stats,
        "tau": stats["tokens"] / max(stats["verify"], 1),
        "wall_s": round(wall, 2),
        "tok_s": stats["tokens"] / max(wall, 1e-9),
    }
    print("summary:", json.dumps(summary), file=sys.stderr)
    return summary


def run_batch(engine, tok, jobs, base, chat):
    """Generate a batch; if the batch fails, retry each job alone so one bad request fails alone."""

    def text_of(job):
        if "messages" in job:
            return tok.apply_chat_template(job["messages"], tokenize=False, add_generation_prompt=True)
        if chat:
            return tok.apply_chat_template(
                [{"role": "user", "content": job["prompt"]}], tokenize=False, add_generation_prompt=True
            )
        return job["prompt"]

    def one(job, o):
        return {
            "text": o["text"],
            "output_tokens": o["meta_info"]["completion_tokens"],
            "spec_accept_length": o["meta_info"].get("spec_accept_length"),
            "meta": o["meta_info"],
        }

    try:
        prompts = [text_of(j) for j in jobs]
        params = [{**base, **j.get("sampling_params", {})} for j in jobs]
        return [one(j, o) for j, o in zip(jobs, engine.generate(prompt=prompts, sampling_params=params))]
    except Exception as e:  # noqa: BLE001 - every failure becomes that line's error record
        if len(jobs) == 1:
            return [{"error": f"{type(e).__name__}: {e}"}]
    results = []
    for j in jobs:
        results.extend(run_batch(engine, tok, [j], base, chat))
    return results


if __name__ == "__main__":
    main()
