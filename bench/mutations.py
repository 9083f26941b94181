"""Mutation runs: each named mutation (one exact text replacement in one source file) is applied, the
extension rebuilt when it touched csrc/, a test selection run, its failures counted, and the file
restored (always, rebuilt again for csrc/); one row per mutation is appended to
bench/results/mutations.jsonl. "A mutation fails N tests" claims in the docs cite these rows.

    flock /tmp/cpu.lock .venv/bin/python bench/mutations.py min_new_ban_off residual_unclamped
    flock /tmp/cpu.lock .venv/bin/python bench/mutations.py rms_norm_scalar_reassoc --tests "python_tests/test_cpu_isa.py -k each"
    .venv/bin/python bench/mutations.py --list

Run it under the CPU lock: a mutated file is seen by every process that imports it meanwhile. A mutation
whose text is not found exactly once is an error (the source moved: update the mutation), never a pass.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from provenance import ROOT, append_rows, base_fields, stamp

PY = os.path.join(ROOT, ".venv", "bin", "python")
RESULTS = os.path.join(ROOT, "bench", "results", "mutations.jsonl")


@dataclass(frozen=True)
class Mutation:
    path: str  # relative to the repository
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # the default pytest selection (paths, node ids, or -k expressions)
    why: str
    env: dict = field(default_factory=dict)


M = Mutation
MUTATIONS = {
    "min_new_ban_off": M(
        "sglang_dflash/pipeline/penalties.py",
        "ban = lens < rows.min_new_tokens.to(dev)[:, None]",
        "ban = lens < 0 * rows.min_new_tokens.to(dev)[:, None]",
        ("python_tests/test_served_edges.py", "-k", "min_new"),
        "min_new_tokens no longer bans the eos ids in verify blocks",
    ),
    "residual_unclamped": M(
        "sglang_dflash/pipeline/target_sampling.py",
        "return (p - q).clamp_min(0)",
        "return p - q",
        ("python_tests/test_q_rules.py",),
        "a rejected draft is redrawn from p - q unclamped (negative weights)",
    ),
    "residual_from_p": M(
        "sglang_dflash/pipeline/target_sampling.py",
        "return (p - q).clamp_min(0)",
        "return p + 0 * q",
        ("python_tests/test_dflash2_serving.py", "-k", "unseeded_draws"),
        "a rejected DFlash 2 sampled path is redrawn from p instead of the residual",
    ),
    "grammar_end_finishes_early": M(
        "sglang_dflash/srt/hooks.py",
        "            req.dflash_grammar_ended_run = True",
        "            pass",
        ("python_tests/test_structured.py", "-k", "edges"),
        "a run ending on a grammar's last token finishes without the token plain decoding commits after it",
    ),
    "accept_off_by_one": M(
        "csrc/dflash_ops.cpp",
        "while (a + 1 < B && di[a + 1] == ti[a]) ++a;",
        "while (a + 1 < B && di[a + 1] == ti[a + 1]) ++a;",
        ("python_tests/test_kernels.py", "python_tests/test_lossless.py"),
        "acceptance compares a draft with the target token one position late",
    ),
    "rms_norm_scalar_reassoc": M(
        "csrc/cpu/rms_norm_cpu.cpp",
        "bf16((sp[t * H + h] * r) * static_cast<float>(wp[h]))",
        "bf16(sp[t * H + h] * (r * static_cast<float>(wp[h])))",
        ("python_tests/test_rms_norm.py", "python_tests/test_cpu_isa.py"),
        "the scalar RMSNorm scales by r * w (SGLang rounds x * r first): AVX-512 hosts reach it only capped",
    ),
}


def rebuild() -> None:
    env = {**os.environ, "SGLANG_DFLASH_WERROR": "1"}
    cmd = [PY, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", ROOT]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def count(xml_path: str) -> dict:
    """pytest's junit XML -> {tests, failed, errors, skipped}."""
    if not os.path.exists(xml_path):
        return {"tests": 0, "failed": 0, "errors": 0, "skipped": 0}
    root = ET.parse(xml_path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    get = lambda k: int(suite.get(k, 0))  # noqa: E731
    return {"tests": get("tests"), "failed": get("failures"), "errors": get("errors"), "skipped": get("skipped")}


def run_tests(tests: tuple[str, ...], env: dict, xml_path: str, timeout: int) -> tuple[int, dict]:
    cmd = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml_path}", *tests]
    try:
        rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    return rc, count(xml_path)


def apply(mut: Mutation) -> str:
    """Write the mutated file; returns the original text (the caller restores it)."""
    path = os.path.join(ROOT, mut.path)
    with open(path) as f:
        text = f.read()
    n = text.count(mut.old) if mut.old else 0
    if n != 1:
        raise SystemExit(f"{mut.path}: the mutation's text occurs {n} times, not once: update MUTATIONS")
    with open(path, "w") as f:
        f.write(text.replace(mut.old, mut.new))
    return text


def run_one(name: str, tests: tuple[str, ...] | None, timeout: int) -> dict:
    mut = MUTATIONS[name]
    tests = tests or mut.tests
    native = mut.path.startswith("csrc/")
    xml_path = os.path.join("/tmp", f"mutation-{name}-{os.getpid()}.xml")
    start = time.time()
    original = apply(mut)
    try:
        if native:
            rebuild()
        rc, counts = run_tests(tests, mut.env, xml_path, timeout)
    finally:
        with open(os.path.join(ROOT, mut.path), "w") as f:
            f.write(original)
        if native:
            rebuild()
    caught = counts["failed"] + counts["errors"]
    row = {"mutation": name, "file": mut.path, "why": mut.why, "selection": list(tests), "rc": rc, **counts}
    row.update(caught=caught, seconds=round(time.time() - start, 1))
    print(f"{name}: {caught} of {counts['tests']} tests fail (rc {rc})", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="mutations to run (--list shows them)")
    ap.add_argument("--tests", help="pytest arguments instead of each mutation's default, one string")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds the tests of one mutation may take")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list or not args.names:
        for name, m in MUTATIONS.items():
            print(f"{name:22s} {m.path}: {m.why}\n{'':22s} tests: {' '.join(m.tests)}")
        return
    unknown = [n for n in args.names if n not in MUTATIONS]
    if unknown:
        raise SystemExit(f"unknown mutations {unknown}: one of {', '.join(MUTATIONS)}")
    prov = stamp()  # before any file is mutated: the commit and work tree measured
    rows = [run_one(n, tuple(shlex.split(args.tests)) if args.tests else None, args.timeout) for n in args.names]
    rows = [{**r, **base_fields(prov)} for r in rows]
    run = append_rows(RESULTS, rows, prov)
    print(f"{RESULTS}: run {run}")
    sys.exit(0)


if __name__ == "__main__":
    main()
