"""The start-up step-cost profile (step_profile.py), cached in the user cache.

Measuring cost(bs, W) takes tens of seconds at every start on a small CPU host, and its result
depends only on what runs a step and where: the target and drafter (their configs), dtype, device,
the host's CPU, block size, thread count, TP rank, the candidate widths and batch sizes, the
package's code (version and built extension), torch and SGLang, and every SGLANG_DFLASH_* switch
(they route the step's ops). A file per key holds the table; any change to the key measures again,
and a file that cannot be read as the key's table is measured again and overwritten.

A CPU profile measured while other processes ran on this process's cores is served but not stored:
it holds their load, not this host's, and nothing corrects a stored table later.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import tempfile
import time

import torch

from sglang_dflash.cpu import contention
from sglang_dflash.cpu.cpu_threads import usable_cores
from sglang_dflash.pipeline.step_cost import CostTable

logger = logging.getLogger("sglang_dflash")

CACHE_DIR = "~/.cache/sglang_dflash/step_profile"
FORMAT = 1  # bump when the file's layout or the profile's method changes
BUSY_SHARE = 0.25  # others' cores on ours, beyond the cores our threads leave free, that void a profile
BUSY_MIN_S = 0.5  # and at least this many seconds of theirs (a fast profile's jiffy noise is not load)


def cache_dir() -> str:
    return os.path.expanduser(CACHE_DIR)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _file_stamp(path: str | None) -> str:
    """A folder's config.json digest, or a file's size and mtime: what identifies a checkpoint's shape
    or a build without reading gigabytes of weights."""
    if not path:
        return "none"
    config = os.path.join(path, "config.json")
    try:
        if os.path.isfile(config):
            with open(config, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()[:16]
        st = os.stat(path)
        return f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return "none"


def _cpu() -> dict:
    """The host CPU's model name and feature flags (/proc/cpuinfo's first processor)."""
    info = {"machine": platform.machine(), "model": "", "flags": ""}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name == "model name" and not info["model"]:
                    info["model"] = value.strip()
                elif name == "flags":
                    info["flags"] = hashlib.sha256(" ".join(sorted(value.split())).encode()).hexdigest()[:16]
                    break
    except OSError:
        pass
    return info


def _extension() -> str:
    spec = importlib.util.find_spec("sglang_dflash._C")
    return _file_stamp(spec.origin if spec else None)


def _sources() -> str:
    """The package's own Python files (names, sizes, mtimes): an edit in a checkout measures again,
    as a new version or build does."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            st = os.stat(os.path.join(folder, name))
            digest.update(f"{os.path.relpath(folder, root)}/{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def profile_key(worker, widths, batch_sizes) -> dict:
    """Everything that changes the profiled step's cost on this worker."""
    runner, args = worker.model_runner, worker.server_args
    device, draft = worker.device_type, getattr(args, "speculative_draft_model_path", None)
    return {
        "format": FORMAT,
        "model": [str(args.model_path), _file_stamp(str(args.model_path))],
        "drafter": [str(draft), _file_stamp(draft)],
        "dtype": str(runner.dtype),
        "device": torch.cuda.get_device_name(torch.device(worker.device)) if device == "cuda" else device,
        "cpu": _cpu(),
        "threads": torch.get_num_threads(),
        "block_size": int(worker.block_size),
        "tp": [int(getattr(runner, "tp_rank", 0)), int(getattr(runner, "tp_size", 1))],
        "attention_backend": str(getattr(args, "attention_backend", None)),
        "cuda_graph": not getattr(args, "disable_cuda_graph", False),
        "widths": [int(w) for w in widths],
        "batch_sizes": [int(b) for b in batch_sizes],
        "versions": {
            "sglang_dflash": _version("sglang-dflash"),
            "extension": _extension(),
            "sources": _sources(),
            "torch": torch.__version__,
            "sglang": _version("sglang"),
        },
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("SGLANG_DFLASH_")},
    }


def cache_path(key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return os.path.join(cache_dir(), f"{digest}.json")


def load(key: dict) -> CostTable | None:
    """The cached table for `key`, or None (no file, another key's, or unreadable)."""
    path = cache_path(key)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
        if saved["key"] != key:
            return None
        seconds = {(int(bs), int(w)): float(s) for bs, w, s in saved["seconds"]}
        return CostTable(saved["batch_sizes"], saved["widths"], seconds)
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("DFLASH step cost profile cache %s unreadable (%s): measuring again", path, e)
        return None


def store(key: dict, table: CostTable) -> str | None:
    """Writes `table` under `key` (a temporary file renamed over the old one: readers never see half
    a file); the path, or None where the cache cannot be written (the profile still serves)."""
    path = cache_path(key)
    rows = [[bs, w, s] for (bs, w), s in sorted(table.table.items())]
    body = {"key": key, "batch_sizes": table.batch_sizes, "widths": table.widths, "seconds": rows}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".profile.", dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, indent=1)
        os.replace(tmp, path)
        return path
    except OSError as e:
        logger.warning("DFLASH step cost profile not cached (%s)", e)
        return None


def measured_alone(measure, threads: int):
    """measure() -> (its result, whether other processes competed with its `threads` threads: they
    ran on this process's cores for more than the cores those threads leave free, plus BUSY_SHARE,
    and BUSY_MIN_S in all; the log's words)."""
    cores = sorted(usable_cores())

    def sample():  # (busy ticks of our cores, our own ticks), None where /proc/stat is not there
        try:
            return contention.busy_ticks(cores), contention.process_ticks(os.getpid())
        except OSError:
            return None

    t0, before = time.monotonic(), sample()
    result = measure()
    wall, after = time.monotonic() - t0, sample()
    if before is None or after is None:
        return result, False, "unknown (no /proc/stat)"
    others = max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / contention.TICK)
    spare = max(0, len(cores) - threads)
    words = f"other processes ran {others:.1f} s on its {len(cores)} cores in {wall:.1f} s"
    return result, others > max(BUSY_MIN_S, (spare + BUSY_SHARE) * wall), words


def cached_costs(worker, widths, batch_sizes, measure) -> CostTable:
    """The profile for this worker: loaded when its key was measured before, else `measure(worker,
    widths, batch_sizes)` and stored."""
    key = profile_key(worker, widths, batch_sizes)
    table = load(key)
    if table is not None:
        logger.info(
            "DFLASH step cost profile loaded from %s (ms per step, forced monotone):\n%s",
            cache_path(key),
            table.describe(),
        )
        return table
    table, busy, words = measured_alone(lambda: measure(worker, widths, batch_sizes), torch.get_num_threads())
    if busy and worker.device_type == "cpu":
        logger.warning("DFLASH step cost profile: %s; served, not cached (the next start measures again)", words)
        return table
    path = store(key, table)
    logger.info("DFLASH step cost profile measured%s", f", cached at {path}" if path else "")
    return table
