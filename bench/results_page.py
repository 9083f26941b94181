"""Regenerate docs/results.md, the README's headline table and bench/results/real_bench.png from the
rows in bench/results/*.jsonl. Nothing on that page is typed by hand: change this script or the rows.

    python bench/results_page.py           # rewrite the page, the README table and the plot
    python bench/results_page.py --check   # exit 1 if the page or the README table is stale (no writes)

Every row carries `run` (date + commit of the run), its commit, dirty flag and time (bench/provenance.py).
The headline: for each temperature (0, 1) and concurrency (1, 4, 16, 32), the newest real_bench run
that served the shipped drafter with both `plain` and `adaptive` (the default DFLASH) rows there.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_tables import (  # noqa: E402
    drafter_arms,
    f1,
    f2,
    micro,
    rows,
    runs,
    scale_out,
    served,
    step_profile,
    graphs_bench,
    soak,
    spread,
    table,
    traces,
    training,
    widths,
)
from results_cpu import cpu_linear, layer_stack  # noqa: E402
from results_gpu_peer import datagen, gpu_check, peer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
PAGE = os.path.join(ROOT, "docs", "results.md")
README = os.path.join(ROOT, "README.md")
WEIGHTS = "sglang_dflash/drafters/smollm2-135m-instruct-dflash/model.safetensors"
BEGIN, END = "<!-- results_page.py: headline -->", "<!-- /results_page.py -->"
CELLS = [(t, c) for t in (0.0, 1.0) for c in (1, 4, 16, 32)]


def git(*args: str) -> str | None:
    p = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


def served_shipped(r: dict, ship: str | None) -> bool:
    """The run served today's drafter weights: measured at or after the commit that shipped them, or
    on its parent with those weights in the (dirty) tree."""
    if not ship:
        return True
    if git("merge-base", "--is-ancestor", ship, r["commit"]) is not None:
        return True
    dirty_weights = WEIGHTS in (r.get("dirty_files") or [])
    return dirty_weights and git("merge-base", "--is-ancestor", ship + "^", r["commit"]) is not None


def headline(rs: list[dict]) -> tuple[list[str], list[dict]]:
    ship = git("log", "-1", "--format=%h", "--", WEIGHTS)
    cells, missing = [], []
    for t, c in CELLS:
        here = [r for r in rs if r["temperature"] == t and r["concurrency"] == c and served_shipped(r, ship)]
        by_run = runs(here)
        pick = next((g for g in by_run.values() if {"plain", "adaptive"} <= {r["config"] for r in g}), None)
        if pick is None:
            missing.append(f"T={t:g} c={c}")
            continue
        plain, dfl = (next(r for r in pick if r["config"] == k) for k in ("plain", "adaptive"))
        cells.append((t, c, plain, dfl))
    body = [
        [f"{t:g}", c, d["requests"], f1(p["tok_s"]), f1(d["tok_s"]), spread(d, "speedup", f2, "x"), f2(d["tau"])]
        + [widths(d)]
        + [f"`{d['run']}`{' (dirty)' if d.get('dirty') else ''}"]
        for t, c, p, d in cells
    ]
    head = ["T", "concurrency", "requests", "plain tok/s", "DFLASH tok/s", "speedup (min-max)", "tau", "verify widths"]
    head.append("run")
    lines = table(head, body) + [""]
    for run, (_, _, p, d) in {d["run"]: cell for cell in cells for d in [cell[3]]}.items():
        how = f"commit `{d['commit'][:7]}`, measured {d['time'][:16]}, {d['max_new_tokens']} new tokens"
        how += f", {d['repeats']} repeats ABBA" + ", --ignore-eos" * bool(d.get("ignore_eos"))
        if WEIGHTS in (d.get("dirty_files") or []):
            how += f"; dirty: the drafter weights, uncommitted then, committed next as `{ship}`"
        lines.append(f"- `{run}`: {how}.")
    lines += ["", f"Not measured with the weights shipped at `{ship}`: {', '.join(missing) or 'none'}."]
    return lines, [d for *_, d in cells] + [p for _, _, p, _ in cells]


# ---- page -----------------------------------------------------------------------------------------
def found_kinds() -> set[str]:
    return {os.path.basename(p)[: -len(".jsonl")] for p in glob.glob(os.path.join(RESULTS, "*.jsonl"))}


def page(head_lines: list[str]) -> str:
    known = {"real_bench", "tiny_bench", "soak", "drafter_arms", "train_summary", "width_trace", "ops_cpu"}
    known |= {"draft_head", "sampling_bench", "train_step", "attention_bench", "draft_rope"}
    known |= {"scale_out", "step_profile", "cpu_linear", "gpu_check_kernels", "peer_bench", "datagen"} & found_kinds()
    known |= {"graphs_bench", "layer_stack"} & found_kinds()
    found = {os.path.basename(p)[: -len(".jsonl")] for p in glob.glob(os.path.join(RESULTS, "*.jsonl"))}
    assert found == known, (
        f"results files without a section here: {found - known}; sections without a file: {known - found}"
    )
    parts = [
        "# Results",
        "",
        "Generated by `python bench/results_page.py` from `bench/results/*.jsonl`; do not edit by hand.",
        "Each table names its run (`YYYY-MM-DD-<commit>`: the date and commit measured), newest first.",
        "tau = committed tokens / verify steps over a row's requests; a speedup is paired with plain",
        "decoding in the same repeat, min-max over repeats. Method: [serving.md](serving.md#benchmarks).",
        "",
        "## Headline: the shipped drafter on the embedded model",
        "",
        *head_lines,
        "",
        "![plain vs DFLASH](../bench/results/real_bench.png)",
        "",
        "## Served: the embedded SmolLM2-135M-Instruct (`real_bench.jsonl`)",
        "",
        *served("real_bench"),
        "## Served: the tiny steered pair (`tiny_bench.jsonl`)",
        "",
        *served("tiny_bench"),
        *(
            ["## Scale-out layouts (`scale_out.jsonl`, `python bench/scale_out_bench.py`)", "", *scale_out()]
            if "scale_out" in known
            else []
        ),
        *(
            ["## Where a served step goes (`step_profile.jsonl`, `python bench/step_profile.py`)", "", *step_profile()]
            if "step_profile" in known
            else []
        ),
        *(
            [
                "## The target's GEMMs on CPU (`cpu_linear.jsonl`, `python bench/cpu_linear_bench.py`)",
                "",
                "ms per step of SmolLM2-135M's GEMMs (30 layers + LM head), weights streamed from memory.",
                "",
                *cpu_linear(),
            ]
            if "cpu_linear" in known
            else []
        ),
        *(
            [
                "## The target's forward outside the server (`layer_stack.jsonl`, `python bench/layer_stack_bench.py`)",
                "",
                "SmolLM2-135M's 30 layers + final norm + LM head on a step's tensors (each layer one `llama_layer`",
                "call), and each op of the layer over the 30 layers on the same inputs.",
                "",
                *layer_stack(),
            ]
            if "layer_stack" in known
            else []
        ),
        *(
            [
                "## The draft stage under step graphs on CPU (`graphs_bench.jsonl`, `python bench/graphs_bench.py`)",
                "",
                *graphs_bench(),
            ]
            if "graphs_bench" in known
            else []
        ),
        *(
            [
                "## llama.cpp beside us (`peer_bench.jsonl`, `make bench-peer`)",
                "",
                *peer(),
            ]
            if "peer_bench" in known
            else []
        ),
        *(
            [
                "## GPU check, kernels tier (`gpu_check_kernels.jsonl`, `bench/checks/gpu_check.sh --kernels`)",
                "",
                *gpu_check(),
            ]
            if "gpu_check_kernels" in known
            else []
        ),
        "## Soak (`soak.jsonl`)",
        "",
        *soak(),
        "",
        "## Per-step traces (`width_trace.jsonl`, `python bench/width_trace.py`)",
        "",
        *traces(),
        "",
        "## Drafter walks: held-out walk tau, first 128 tokens (`drafter_arms.jsonl`)",
        "",
        *drafter_arms(),
        *(
            ["## Training data through DFLASH (`datagen.jsonl`, `bench/drafter_levers.sh`)", "", *datagen()]
            if "datagen" in known
            else []
        ),
        "## Training runs (`train_summary.jsonl`)",
        "",
        *training(),
        "",
        "## Micro-benchmarks (CPU)",
        "",
        *micro(),
    ]
    return "\n".join(parts).rstrip() + "\n"


def plot(cells: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), squeeze=False)
    for ax, t in zip(axes[0], (0.0, 1.0)):
        for cfg, label in (("plain", "plain"), ("adaptive", "DFLASH")):
            rs = sorted(
                (r for r in cells if r["temperature"] == t and r["config"] == cfg), key=lambda r: r["concurrency"]
            )
            xs = [r["concurrency"] for r in rs]
            line = ax.plot(xs, [r["tok_s"] for r in rs], marker="o", label=label)[0]
            ax.fill_between(
                xs, [r["tok_s_min"] for r in rs], [r["tok_s_max"] for r in rs], color=line.get_color(), alpha=0.2
            )
        ax.set(xscale="log", xlabel="concurrency", ylabel="output tokens/s (min-max band)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"SmolLM2-135M-Instruct, temperature {t:g}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    head_lines, cells = headline(rows("real_bench"))
    text = page(head_lines)
    with open(README) as f:
        readme = f.read()
    i, j = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    new_readme = readme[:i] + "\n" + "\n".join(head_lines) + "\n" + readme[j:]
    old = open(PAGE).read() if os.path.exists(PAGE) else ""
    if "--check" in sys.argv:
        stale = [p for p, a, b in ((PAGE, old, text), (README, readme, new_readme)) if a != b]
        print("stale: " + ", ".join(stale) if stale else "up to date")
        return 1 if stale else 0
    os.makedirs(os.path.dirname(PAGE), exist_ok=True)
    with open(PAGE, "w") as f:
        f.write(text)
    with open(README, "w") as f:
        f.write(new_readme)
    plot(cells, os.path.join(RESULTS, "real_bench.png"))
    print(f"wrote {os.path.relpath(PAGE, ROOT)} ({text.count(chr(10))} lines), the README table, real_bench.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
