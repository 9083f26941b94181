"""The start-up step-cost profile (srt/step_profile.py: ms per decode step by batch size and verify
width, the table the width controller decides on) of the embedded DFLASH server, per arm, side by
side in one run: each arm is a checkout (`--arm NAME PATH`, the package imported from PATH; `.` is
this one) started fresh, alternating ABBA over --repeats, the profile re-measured at every start.

python bench/profile_table.py --arm before ~/.cache/sglang_dflash/ext/<ref> --arm after . [--repeats 2]
    [--arm-env NAME KEY=VALUE ...]   (an arm's own environment, e.g. --arm-env packed SGLANG_DFLASH_CPU_OPS=packed=1)
Appends one run to bench/results/profile_table.jsonl (one row per arm, repeat and cell) and prints
each cell's ratio after / before and width W over width 1 per arm.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402

from sglang_dflash.cpu_serving import cpu_env, server_flags  # noqa: E402
from sglang_dflash.drafters import shipped_drafter  # noqa: E402
from sglang_dflash.embedded import derive  # noqa: E402
from sglang_dflash.testing.servers import free_port, stop  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELL = re.compile(r"([\d.]+)ms")


def profile(path: str, log_dir: str, name: str, env: dict) -> dict[tuple[int, int], float]:
    """{(bs, W): ms} from one fresh server's start-up log; env: the arm's own variables."""
    port = free_port()
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", derive(), "--port", str(port)]
    argv += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", shipped_drafter()]
    argv += ["--dtype", "bfloat16", "--log-level", "info"]
    for k, v in server_flags().items():
        argv += [k] if v is None else [k, v]
    environ = {**os.environ, **env}
    environ = {**environ, **cpu_env(environ), "PYTHONPATH": os.path.abspath(path)}
    environ["HOME"] = tempfile.mkdtemp(prefix="profile-home-")  # an empty profile cache: measured at this start
    log_path = os.path.join(log_dir, f"profile-{name}-{port}.log")
    with open(log_path, "w") as log:  # cwd without the package: PYTHONPATH decides which code serves
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=environ, cwd=log_dir, start_new_session=True
        )
    try:
        deadline = time.time() + 900
        while time.time() < deadline:
            text = open(log_path, errors="replace").read()
            if "DFLASH step cost profile" in text:
                time.sleep(1)
                text = open(log_path, errors="replace").read()
                return parse(text.split("DFLASH step cost profile", 1)[1])
            if proc.poll() is not None:
                raise RuntimeError(f"{name}: server exited; log {log_path}")
            time.sleep(1)
        raise TimeoutError(f"{name}: no profile in 900 s; log {log_path}")
    finally:
        stop(proc)


def parse(text: str) -> dict[tuple[int, int], float]:
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("bs\\W"))
    widths = [int(w) for w in lines[head].split()[1:]]
    out = {}
    for ln in lines[head + 1 :]:
        parts = ln.split()
        if not parts or not parts[0].isdigit():
            break
        for w, cell in zip(widths, parts[1:]):
            out[(int(parts[0]), w)] = float(CELL.match(cell).group(1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", nargs=2, action="append", required=True, metavar=("NAME", "PATH"))
    ap.add_argument("--arm-env", nargs=2, action="append", default=[], metavar=("NAME", "KEY=VALUE"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--label")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "profile_table.jsonl"))
    args = ap.parse_args()
    prov = provenance.stamp()
    log_dir = os.path.join(os.path.expanduser("~"), ".cache", "sglang_dflash", "bench_logs")
    os.makedirs(log_dir, exist_ok=True)
    rows, best = [], {}
    for rep in range(args.repeats):
        for name, path in provenance.arm_order(args.arm, rep):
            env = dict(kv.split("=", 1) for n, kv in args.arm_env if n == name)
            table = profile(path, log_dir, name, env)
            for (bs, w), ms in table.items():
                rows.append(
                    {
                        **provenance.base_fields(prov),
                        "arm": name,
                        "env": env,
                        "repeat": rep,
                        "bs": bs,
                        "width": w,
                        "ms": ms,
                    }
                )
                best[(name, bs, w)] = min(ms, best.get((name, bs, w), ms))
            print(name, rep, table, flush=True)
    for r in rows:
        r["label"] = args.label
    run = provenance.append_rows(args.out, rows, prov)
    names = [a[0] for a in args.arm]
    cells = sorted({(bs, w) for _, bs, w in best})
    print(f"run {run}: best of {args.repeats} ms, W over W1 per arm" + (", last arm / first" if len(names) > 1 else ""))
    for bs, w in cells:
        ms = [best.get((n, bs, w)) for n in names]
        over1 = [best[(n, bs, w)] / best[(n, bs, 1)] for n in names if (n, bs, 1) in best and (n, bs, w) in best]
        ratio = f"  {ms[-1] / ms[0]:.2f}x" if len(names) > 1 and None not in ms else ""
        print(
            f"bs {bs:>3} W {w:>2}: "
            + " ".join(f"{m:7.1f}" for m in ms if m)
            + "  /W1 "
            + " ".join(f"{x:.2f}" for x in over1)
            + ratio
        )


if __name__ == "__main__":
    main()
