"""The embedded target's forward outside the server: one decode / verify step of SmolLM2-135M's 30
layers + final norm + LM head on the tensors a served step hands them (bf16 weights, every layer its
own, so a step streams 270 MB as a served one does; a KV pool with `--prefix` tokens of context a
request), timed whole (each layer one `llama_layer` call, as cpu/llama_stack.py runs it) and by
component (each op of the layer over all 30 layers, on the same inputs). What the whole costs above
the sum of its parts is the layer op's own overhead; what a served step costs above the whole is
serving (SGLang's scheduler, sampling, our worker), read beside `bench/step_profile.py`.

python bench/layer_stack_bench.py [--rows 1 4] [--bs 1 16] [--prefix 256] [--ragged] [--threads 1] [--before REF]
--before REF: a kernel change's before/after in one run: the extension as built at git REF (a worktree
under ~/.cache/sglang_dflash/ext/, built once per commit) and this checkout's, each arm a process of
its own (one torch library per process), alternating ABBA over --repeat.
Appends to bench/results/layer_stack.jsonl (ms per step: whole and each component) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An arm's process imports the package (and its extension) from --root: a --before worktree or here.
ARM_ROOT = sys.argv[sys.argv.index("--root") + 1] if "--root" in sys.argv else ROOT
sys.path[:0] = [ARM_ROOT, os.path.join(ROOT, "bench"), os.path.join(ROOT, "bench", "checks")]
import provenance  # noqa: E402
from sglang_dflash import kernels  # noqa: E402  (before gpu_check, which puts this checkout first on the path)
from sglang_dflash.kernels.reference import rope_cos_sin_cache  # noqa: E402
from sglang_dflash.cpu import cpu_linear  # noqa: E402

try:
    from sglang_dflash.cpu import packed_weights  # an arm's build from before it has none
except ImportError:
    packed_weights = None
from gpu_check import timeit  # noqa: E402  (the timing code of every bench here)

OUT = os.path.join(ROOT, "bench", "results", "layer_stack.jsonl")
LAYERS, HID, H, HKV, D, INTER, VOCAB, EPS = 30, 576, 9, 3, 64, 1536, 49152, 1e-5
COMPONENTS = ("gemm", "norm", "rope", "kv_write", "attention", "act")


def model(g):
    """(30 layers' weights, final norm, LM head): random, the embedded target's shapes."""
    w = lambda *s: (torch.randn(*s, generator=g) / s[-1] ** 0.5).bfloat16()  # noqa: E731
    ln = lambda: (1 + 0.1 * torch.randn(HID, generator=g)).bfloat16()  # noqa: E731
    layers = [
        dict(
            ln1=ln(),
            qkv_w=w((H + 2 * HKV) * D, HID),
            o_w=w(HID, H * D),
            ln2=ln(),
            gate_up_w=w(2 * INTER, HID),
            down_w=w(HID, INTER),
        )  # fmt: skip
        for _ in range(LAYERS)
    ]
    return layers, ln(), w(VOCAB, HID)


def step_inputs(g, bs: int, rows: int, prefix: int, scatter: bool, ragged: bool = False):
    """bs requests of `rows` chain rows after `prefix` committed tokens each (ragged: spread evenly over
    prefix/4 .. 7 prefix/4, the same mean, longest first: a served batch lists its oldest requests first),
    each request's slots in one run (as SGLang's allocator hands them out on a fresh pool) or scattered
    over the pool (a long-running server's free list): (positions, out_loc, slots, prefix, pools)."""
    T, width = bs * rows, 2 * prefix + rows
    S = 2 * bs * width + 1
    order = torch.randperm(S - 1, generator=g) if scatter else torch.arange(S - 1)
    slots = (1 + order[: bs * width]).view(bs, width)
    spread = torch.linspace(7 * prefix / 4, prefix / 4, bs).long()
    pre = spread if ragged and bs > 1 else torch.full((bs,), prefix, dtype=torch.long)
    positions = (pre[:, None] + torch.arange(rows)).reshape(T)
    out_loc = slots.gather(1, pre[:, None] + torch.arange(rows)).reshape(T)
    pools = [(torch.randn(S, HKV, D, generator=g).bfloat16(), torch.randn(S, HKV, D, generator=g).bfloat16())
             for _ in range(LAYERS)]  # fmt: skip
    return positions, out_loc, slots, pre, pools


def whole(ops, layers, norm, head, h0, cs, inp, gemm_rows):
    positions, out_loc, slots, pre, pools = inp
    h, residual = h0, None
    for w, (kc, vc) in zip(layers, pools):
        h, _, residual = ops.llama_layer(h, residual, positions, w["ln1"], w["qkv_w"], None, w["o_w"], w["ln2"],
                                         w["gate_up_w"], w["down_w"], cs, kc, vc, out_loc, slots, pre, H, HKV, D,
                                         EPS, D**-0.5, True, gemm_rows)  # fmt: skip
    return cpu_linear.linear(ops.rms_norm(h, residual, norm, EPS)[0], head)


def components(ops, layers, head, h0, cs, inp):
    """Each op of a layer over all 30 layers on fixed inputs of the step's shapes: name -> callable
    (the GEMMs routed by rows as the served layers and the layer op route them)."""
    positions, out_loc, slots, pre, pools = inp
    T = h0.shape[0]
    linear = cpu_linear.linear
    qkv = linear(h0, layers[0]["qkv_w"])
    q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
    q3, k3, v3 = q.reshape(T, H, D), k.reshape(T, HKV, D), v.reshape(T, HKV, D)
    a = h0.new_empty(T, H * D).normal_()
    gu = h0.new_empty(T, 2 * INTER).normal_()
    act = h0.new_empty(T, INTER).normal_()
    loc = out_loc.long()

    def gemm():
        for w in layers:
            for x, name in ((h0, "qkv_w"), (a, "o_w"), (h0, "gate_up_w"), (act, "down_w")):
                linear(x, w[name], None)
        linear(h0, head, None)

    def kv_write():
        for kc, vc in pools:
            kc.index_put_((loc,), k3)
            vc.index_put_((loc,), v3)

    def act_():
        for _ in layers:
            torch.nn.functional.silu(gu[:, :INTER]) * gu[:, INTER:]

    return {
        "gemm": gemm,
        "norm": lambda: [ops.rms_norm(h0, h0, w[n], EPS) for w in layers for n in ("ln1", "ln2")],
        "rope": lambda: [ops.rope_qk(positions, q, k, cs, D, True) for _ in layers],
        "kv_write": kv_write,
        "attention": lambda: [ops.chain_attention(q3, kc, vc, slots, pre, D**-0.5, True) for kc, vc in pools],
        "act": act_,
    }


def measure(args) -> list[dict]:
    """One arm, in this process: the package imported from args.root (its extension as built there)."""
    torch.set_num_threads(args.threads)
    assert kernels.load() == "extension", f"build the extension first (make install) in {args.root}"
    here = os.path.realpath(kernels.__file__)
    assert here.startswith(os.path.realpath(args.root) + os.sep), f"{here} is not the arm's package ({args.root})"
    cpu_linear.enable("cpu", torch.bfloat16)  # the served routing: GEMMs past its row bound take torch's
    ops, g = kernels.ops(), torch.Generator().manual_seed(0)
    layers, norm, head = model(g)
    packed = False  # as the worker packs them (cpu/packed_weights.py), where this arm's build has it
    wanted = packed_weights and packed_weights.wanted  # an older arm's takes no argument
    if wanted and (wanted(cpu_linear.amx_bf16()) if wanted.__code__.co_argcount else wanted()):
        ws = [w[n] for w in layers for n in ("qkv_w", "o_w", "gate_up_w", "down_w")] + [head]
        packed = packed_weights.pack_all(ws) == len(ws)
    cs = rope_cos_sin_cache(4096, D, 100000.0)
    gemm_rows = cpu_linear.gemm_rows()
    out = []
    with torch.inference_mode():
        for bs in args.bs:
            for rows in args.rows:
                inp = step_inputs(g, bs, rows, args.prefix, args.scatter, args.ragged)
                h0 = torch.randn(bs * rows, HID, generator=g).bfloat16()
                parts = {
                    n: timeit(f, "cpu", reps=args.reps) * 1e3
                    for n, f in components(ops, layers, head, h0, cs, inp).items()
                }
                ms = timeit(lambda: whole(ops, layers, norm, head, h0, cs, inp, gemm_rows), "cpu", reps=args.reps) * 1e3
                out.append({"bs": bs, "rows": rows, "prefix": args.prefix, "scatter": args.scatter, "ragged": args.ragged,
                            "threads": args.threads, "gemm_rows": min(gemm_rows, 2**31), "packed": packed, "whole_ms": round(ms, 3),
                            "sum_of_parts_ms": round(sum(parts.values()), 3),
                            "parts_ms": {n: round(t, 3) for n, t in parts.items()}})  # fmt: skip
    return out


def built_at(ref: str) -> tuple[str, str]:
    """(short commit, a worktree of it with its extension built in place), built once per commit."""
    sha = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = os.path.join(os.path.expanduser("~"), ".cache", "sglang_dflash", "ext", sha[:12])
    if not os.path.isdir(path):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", path, sha], check=True)
    if not any(f.startswith("_C") for f in os.listdir(os.path.join(path, "sglang_dflash"))):
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=path, check=True)
    return sha[:7], path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prefix", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--scatter", action="store_true", help="each request's KV slots scattered over the pool")
    ap.add_argument("--ragged", action="store_true", help="requests' prefixes 7 prefix/4 .. prefix/4, longest first")
    ap.add_argument("--before", help="git ref whose extension runs as the `before` arm")
    ap.add_argument("--repeat", type=int, default=1, help="ABBA rounds of the two arms (with --before)")
    ap.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)  # an arm's process: where its package is
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    prov = provenance.stamp()
    arms = [("now", ROOT)]
    if args.before:
        sha, path = built_at(args.before)
        arms = [("now", ROOT), (f"before-{sha}", path)]
    order = [a for rep in range(args.repeat) for a in provenance.arm_order(arms, rep)]
    rows_out = []
    for k, (name, root) in enumerate(order):
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--child", "--root", root]
        res = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        )
        assert res.returncode == 0, res.stderr[-3000:]
        rows_out += [
            {"arm": name, "repeat": k // len(arms), **r, **provenance.base_fields(prov)}
            for r in json.loads(res.stdout.strip().splitlines()[-1])
        ]
    print("| arm | bs | rows | whole ms | sum of parts | " + " | ".join(COMPONENTS) + " |")
    print("|---" * (5 + len(COMPONENTS)) + "|")
    for r in rows_out:
        cells = " | ".join(f"{r['parts_ms'][n]:.2f}" for n in COMPONENTS)
        print(f"| {r['arm']} | {r['bs']} | {r['rows']} | {r['whole_ms']:.1f} | {r['sum_of_parts_ms']:.1f} | {cells} |")
    provenance.append_rows(OUT, rows_out, prov)


if __name__ == "__main__":
    main()
