"""What a benchmark row measured, defined once for every bench that writes results (real_bench,
the bench/checks/ scripts, ops_bench, ...), so two rows are comparable only when these fields say so.

- git_state(): the commit measured and whether the work tree differed from it. Paths under
  bench/results/ are left out: a previous run's output does not change what is measured, and
  counting it would mark every second run dirty.
- stamp() / append_rows(): every results file holds one benchmark kind, rows appended run after
  run; each row carries `run` (the date and commit measured, `-2`, `-3`... when that name is taken
  in the file), the commit, dirty flag, time and host facts. Paths are written relative to the
  repository or to `~`, never as one machine's absolute paths.
- server_argv(): the exact server command line of an arm, from sglang_dflash/testing/servers.py
  server_cmd (what servers.launch runs, minus the per-run --port).
- SCHED_FLAGS: DFLASH forces --disable-overlap-schedule and sets --max-running-requests 48 when
  unset (sglang_dflash/srt/hooks.py handle_dflash). By default plain runs SGLang's CPU defaults
  (overlap scheduling on: the baseline a user gets); --match-sched passes SCHED_FLAGS to every arm
  so a ratio isolates the step from the scheduler. Rows record which.
- tau(): THE definition of tau in this repo: committed tokens / verify steps, i.e.
  sum(completion_tokens) / sum(spec_verify_ct) over a row's requests (the same ratio SGLang puts
  in spec_accept_length per request, but pooled, so long requests weigh by their steps). None for
  an arm without speculation (no verify steps).
- flush_cache(): POST /flush_cache until the server accepts it, so no row starts with the prefix
  cache an earlier row filled.
- arm_order() / summarize(): repeats interleave the arms ABBA, and every tok/s and ratio is
  reported as mean with min/max/stdev; a ratio is paired within one repeat (the two arms ran
  minutes apart), never a ratio of two means that each hide their own noise. Ratios: `speedup`
  (arm / plain), `cpu_step` (w1 / plain: our step, no speculation), `spec_share` (arm / w1:
  what speculation itself adds) and `inline_share` (arm / its `~w1` twin: the same ratio inside one
  server lifetime, real_bench.py --inline-w1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

from host_probe import host  # noqa: F401  (bench/ is on sys.path wherever provenance is imported)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCHED_FLAGS = ["--disable-overlap-schedule", "--max-running-requests", "48"]
# What the plugin does to a DFLASH arm when SCHED_FLAGS are not passed (recorded with unmatched rows).
DFLASH_FORCES = "disable_overlap_schedule=True; max_running_requests=48 when unset"
TAU_DEF = "sum(completion_tokens) / sum(spec_verify_ct) over the row's requests"


def _git(*args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def git_state() -> dict:
    """{"commit": HEAD sha or None, "dirty": bool or None, "dirty_files": [...] (first 20)}."""
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain")
    if status is None:
        return {"commit": head.strip() if head else None, "dirty": None, "dirty_files": []}
    # Porcelain v1: "XY path" or "XY old -> new"; the path starts at column 3.
    files = [ln[3:].split(" -> ")[-1].strip('"') for ln in status.splitlines() if ln.strip()]
    files = [f for f in files if not f.startswith("bench/results/")]
    return {"commit": head.strip() if head else None, "dirty": bool(files), "dirty_files": files[:20]}


def stamp() -> dict:
    """Provenance captured once, at the START of a run (before it writes any result file)."""
    return {
        **git_state(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "host": host(),
    }


def portable(obj):
    """obj with every string's absolute repository path made relative and the home folder as `~`."""
    if isinstance(obj, str):
        return obj.replace(ROOT + os.sep, "").replace(ROOT, ".").replace(os.path.expanduser("~"), "~")
    if isinstance(obj, list):
        return [portable(x) for x in obj]
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    return obj


def run_name(prov: dict, taken) -> str:
    """`YYYY-MM-DD-<commit>`; `-2`, `-3`... when a run of that date and commit is already in the file."""
    base = f"{prov['time'][:10]}-{(prov.get('commit') or 'nogit')[:7]}"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    return name


def append_rows(path: str, rows: list[dict], prov: dict) -> str:
    """Append rows to the JSONL at path as one new run (every row gets its `run` name first); returns it."""
    taken = set()
    if os.path.exists(path):
        with open(path) as f:
            taken = {json.loads(line).get("run") for line in f if line.strip()}
    run = run_name(prov, taken)
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps({"run": run, **portable(r)}) + "\n")
    return run


def add_method_args(ap, repeats: int = 2) -> None:
    """The flags every side-by-side bench shares: repeats (ABBA) and scheduler-flag matching."""
    ap.add_argument("--repeats", type=int, default=repeats, help="times the whole arm sequence runs (ABBA order)")
    ap.add_argument(
        "--match-sched",
        action="store_true",
        help="give plain the scheduler flags DFLASH forces (default: SGLang's CPU defaults, overlap on)",
    )
    # --no-match-sched: the old spelling of today's default, accepted so old command lines still run
    ap.add_argument("--no-match-sched", dest="match_sched", action="store_false", help=argparse.SUPPRESS)


def arm_extra(extra: list[str], match_sched: bool) -> list[str]:
    """The extra server flags of an arm: the bench's own plus, when matching, SCHED_FLAGS."""
    return [*extra, *SCHED_FLAGS] if match_sched else list(extra)


def arm(name: str, draft: str, extra: list[str], match_sched: bool):
    """Arm name -> (drafter or None, server flags, environment). `plain`: no speculation;
    `fixed<W>`: the drafter's trained block (W if larger), every step verifying W rows; `w1`
    (= fixed1): our worker decoding one token a step, no speculation; `adaptive`: the drafter's block (`adaptive<B>`: block B), width
    chosen by the controller.
    A `+<rule>` suffix (e.g. `fixed16+q1`) sets the DFlash 1 proposal rule for sampled requests;
    an `@DIR` suffix (e.g. `adaptive@/path/drafter`) serves another drafter; a `-t<N>` suffix (e.g.
    `adaptive-t2`) runs the server's forward on N OpenMP threads (SGLANG_DFLASH_CPU_THREADS; the CPU
    default is the rank's cores); a `-packed` suffix packs the target's weights for oneDNN
    (SGLANG_DFLASH_CPU_OPS packed=1), an `-unpacked` one leaves them as torch holds them (packed=0); a
    `-margin<M>` suffix (e.g. `adaptive-margin0`) sets the controller's SGLANG_DFLASH_WIDEN_MARGIN; a
    `-sched` suffix adds SCHED_FLAGS (e.g. `plain-sched`: plain without overlap scheduling, beside `plain`)."""
    from sglang_dflash import env

    if name.endswith("-sched"):
        d, flags, environ = arm(name.removesuffix("-sched"), draft, extra, False)
        return d, [*flags, *SCHED_FLAGS], environ

    for suffix, value in (("-packed", "1"), ("-unpacked", "0")):
        if name.endswith(suffix):
            d, flags, environ = arm(name.removesuffix(suffix), draft, extra, match_sched)
            ops = env.cpu_ops_with(environ.get(env.CPU_OPS.name, ""), packed=value)
            return d, flags, {**environ, env.CPU_OPS.name: ops}
    base, _, margin = name.rpartition("-margin")
    if base and margin.replace(".", "", 1).isdigit():
        d, flags, environ = arm(base, draft, extra, match_sched)
        return d, flags, {**environ, env.WIDEN_MARGIN.name: margin}
    base, _, threads = name.rpartition("-t")
    if base and threads.isdigit():
        d, flags, environ = arm(base, draft, extra, match_sched)
        return d, flags, {**environ, env.CPU_THREADS.name: threads}
    if "+" in name:
        base, rule = name.split("+", 1)
        if rule not in env.PROPOSAL.choices:
            raise SystemExit(f"--arms {name!r}: unknown proposal rule {rule!r} ({', '.join(env.PROPOSAL.choices)})")
        d, flags, environ = arm(base, draft, extra, match_sched)
        return d, flags, {**environ, env.PROPOSAL.name: rule}
    if "@" in name:  # `adaptive@DIR`: this arm serves the drafter in DIR (drafters side by side)
        base, path = name.split("@", 1)
        return arm(base, path, extra, match_sched)
    if name == "plain":
        return None, arm_extra(list(extra), match_sched), {}
    if name == "w1":
        return arm("fixed1", draft, extra, match_sched)
    for kind in ("fixed", "adaptive"):
        if name.startswith(kind) and (name[len(kind) :].isdigit() or name == "adaptive"):
            from sglang_dflash.model.config import read_block_size

            trained = read_block_size(draft)
            num = int(name[len(kind) :] or trained)
            block = max(num, trained) if kind == "fixed" else num
            flags = arm_extra([*extra, "--speculative-num-draft-tokens", str(block)], match_sched)
            return draft, flags, {env.WIDTH.name: str(num)} if kind == "fixed" else {}
    raise SystemExit(f"--arms: unknown arm {name!r} (plain, w1, fixed<W>, adaptive, adaptive<B>)")


def server_argv(model: str, draft: str | None, dtype: str, extra: list[str]) -> list[str]:
    from sglang_dflash.testing.servers import server_cmd

    return server_cmd(model, draft, dtype, list(extra))


def base_fields(prov: dict) -> dict:
    """What every row names: the commit and tree it ran on, when, and where."""
    keys = ("commit", "dirty", "dirty_files", "time", "host")
    return {k: prov.get(k) for k in keys}


def row_fields(prov: dict, argv: dict[str, list[str]], config: str, match_sched: bool, baseline: str = "plain") -> dict:
    """Provenance fields every JSONL row carries: commit, dirty flag, the row's own server argv and
    the baseline arm's (the two arms its speedup compares), and the scheduler-flag policy."""
    out = {
        "commit": prov["commit"],
        "dirty": prov["dirty"],
        "dirty_files": prov["dirty_files"],
        "time": prov["time"],
        "host": prov.get("host"),
        "argv": argv[config],
        "baseline_argv": argv[baseline],
        "sched_matched": match_sched,
        "sched_flags": SCHED_FLAGS if match_sched else [],
        "tau_def": TAU_DEF,
    }
    if not match_sched:
        out["sched_note"] = "plain: SGLang's CPU defaults (overlap scheduling on); DFLASH arms: " + DFLASH_FORCES
    return out


def tau(metas) -> float | None:
    """Committed tokens per verify step over these requests' meta_info dicts; None without verify steps."""
    metas = list(metas)
    steps = sum(m.get("spec_verify_ct") or 0 for m in metas)
    if not steps:
        return None
    return sum(m.get("completion_tokens") or 0 for m in metas) / steps


def flush_cache(url: str, tries: int = 30) -> None:
    """Empty the prefix cache. SGLang refuses (non-200) while requests are still in flight, which
    can briefly outlast the last HTTP response, so retry; a cache that never flushes is an error."""
    import requests  # here, not at the top: the kernels tier stamps reports on machines without it

    last = None
    for _ in range(tries):
        r = requests.post(url + "/flush_cache", timeout=60)
        if r.ok:
            return
        last = f"http{r.status_code}: {r.text[:200]}"
        time.sleep(0.5)
    raise RuntimeError(f"{url}/flush_cache kept failing: {last}")


def arm_order(arms: list, repeat: int) -> list:
    """ABBA: forward on even repeats, reversed on odd ones, so a slow drift of the machine (thermal,
    another tenant) loads every arm alike instead of always penalising the last one."""
    return list(arms) if repeat % 2 == 0 else list(reversed(arms))


def spread(name: str, xs: list[float]) -> dict:
    """{name: mean, name_min, name_max, name_stdev (0 for one value), name_runs: [...]}."""
    return {
        name: statistics.mean(xs),
        f"{name}_min": min(xs),
        f"{name}_max": max(xs),
        f"{name}_stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        f"{name}_runs": list(xs),
    }


def summarize(runs: list[dict], keys: tuple[str, ...], baseline: str = "plain") -> dict[tuple, dict]:
    """runs: one dict per (repeat, config, *keys) with tok_s and metas (the requests' meta_info).
    Returns {(config, *keys): {"repeats", tok_s spread, speedup spread, "tau", "tokens"}}, where each
    speedup is that repeat's tok_s over the baseline's tok_s in the SAME repeat and keys."""
    base = {(r["repeat"], *(r[k] for k in keys)): r["tok_s"] for r in runs if r["config"] == baseline}
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["config"], *(r[k] for k in keys)), []).append(r)
    cpu_step = paired(runs, keys, "w1", "plain")
    out = {}
    for gk, rs in groups.items():
        ratios = [r["tok_s"] / base[(r["repeat"], *gk[1:])] for r in rs]
        metas = [m for r in rs for m in r["metas"]]
        share = paired(runs, keys, gk[0], "w1").get(gk[1:]) if gk[0] not in ("plain", "w1") else None
        inline = paired(runs, keys, gk[0], gk[0] + "~w1").get(gk[1:])  # real_bench --inline-w1
        out[gk] = {
            "repeats": len(rs),
            **spread("tok_s", [r["tok_s"] for r in rs]),
            **spread("speedup", ratios),
            **(spread("cpu_step", cpu_step[gk[1:]]) if gk[1:] in cpu_step else {"cpu_step": None}),
            **(spread("spec_share", share) if share else {"spec_share": None}),
            **(spread("inline_share", inline) if inline else {"inline_share": None}),
            "tau": tau(metas),
            "tokens": sum(m.get("completion_tokens") or 0 for m in metas),
        }
    return out


def paired(runs: list[dict], keys: tuple[str, ...], num: str, den: str) -> dict[tuple, list[float]]:
    """{cell (the keys' values): [num's tok/s / den's tok/s, one per repeat both arms ran it]}."""
    at = {(r["config"], r["repeat"], *(r[k] for k in keys)): r["tok_s"] for r in runs}
    out: dict[tuple, list[float]] = {}
    for (cfg, rep, *cell), v in at.items():
        if cfg == num and (den, rep, *cell) in at:
            out.setdefault(tuple(cell), []).append(v / at[(den, rep, *cell)])
    return out
