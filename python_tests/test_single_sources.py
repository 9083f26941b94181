"""One source of truth per fact: the block-size policy, resumable JSONL, build-once folders, the
environment variables (the user level checked against the README table, every level listed by
`python -m sglang_dflash.env --all`, the CPU ops' one escape hatch) and the CPU serving settings."""

import glob
import json
import os
import re

import pytest

from sglang_dflash import env
from sglang_dflash.model.config import MAX_BLOCK_SIZE, DrafterConfigError, parse_drafter_config, resolve_block_size
from sglang_dflash.folder_cache import MARKER, build_once
from sglang_dflash.resumable_jsonl import append_rows, done_ids, read_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sources(*patterns):
    """(relative path, text) of the repo's own files matching the glob patterns."""
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True)):
            with open(path) as f:
                yield os.path.relpath(path, ROOT), f.read()


PY_SOURCES = ("sglang_dflash/**/*.py", "python_tests/*.py", "bench/*.py", "bench/checks/*.py")


# ---- block size ------------------------------------------------------------------------------
def drafter_dir(tmp_path, block):
    d = tmp_path / f"drafter-b{block}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"dflash_config": {"block_size": block}}))
    return str(d)


def test_block_size_flag_wins_over_the_drafter_config(tmp_path):
    assert resolve_block_size(8, drafter_dir(tmp_path, 16)) == 8
    assert resolve_block_size(MAX_BLOCK_SIZE, drafter_dir(tmp_path, 4)) == MAX_BLOCK_SIZE


def test_block_size_falls_back_to_the_drafter_config(tmp_path):
    assert resolve_block_size(None, drafter_dir(tmp_path, 16)) == 16
    cfg = parse_drafter_config(
        {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "vocab_size": 50,
            "block_size": 12,
            "dflash_config": {"mask_token_id": 49, "target_layer_ids": [1]},
        },
        4,
    )
    assert resolve_block_size(None, cfg) == 12


@pytest.mark.parametrize("flag", [1, -3, MAX_BLOCK_SIZE + 1])
def test_block_size_out_of_bounds_names_the_flag(tmp_path, flag):
    with pytest.raises(ValueError, match=r"--speculative-dflash-block-size.*must be in \[2, 64\]"):
        resolve_block_size(flag, drafter_dir(tmp_path, 16))


def test_block_size_too_large_in_the_config_names_field_and_flag(tmp_path):
    big = drafter_dir(tmp_path, 128)
    with pytest.raises(DrafterConfigError, match=r"block_size=128.*--speculative-dflash-block-size"):
        resolve_block_size(None, big)
    assert resolve_block_size(16, big) == 16  # the flag fixes it


def test_block_size_policy_lives_in_config_only():
    defs = [p for p, text in sources(*PY_SOURCES) if re.search(r"^MAX_BLOCK_SIZE\s*=", text, re.M)]
    assert defs == ["sglang_dflash/model/config.py"]
    for user in ("sglang_dflash/srt/hooks.py", "sglang_dflash/srt/worker.py"):
        assert "resolve_block_size(" in dict(sources(user))[user], user


# ---- resumable JSONL -------------------------------------------------------------------------
def test_torn_last_line_is_dropped_and_resume_skips_done_ids(tmp_path):
    path = str(tmp_path / "out.jsonl")
    with open(path, "w") as f:
        f.write('{"id": 1, "text": "a"}\nnot json\n{"id": 2, "text": "b"}\n{"id": 3, "te')
    assert list(r["id"] for r in read_rows(path)) == [1, 2]  # reading alone never truncates
    assert open(path).read().endswith('"te')
    done = done_ids(path)
    assert done == {1, 2} and open(path).read().endswith('"b"}\n')  # torn tail cut back
    with append_rows(path) as write:
        for i in [i for i in range(1, 6) if i not in done]:
            write({"id": i, "text": str(i)})
    assert [r["id"] for r in read_rows(path)] == [1, 2, 3, 4, 5]
    assert done_ids(path) == {1, 2, 3, 4, 5}


def test_resumable_jsonl_missing_file_and_odd_rows(tmp_path):
    path = str(tmp_path / "none.jsonl")
    assert done_ids(path) == set() and list(read_rows(path)) == []
    with open(path, "w") as f:
        f.write('[1, 2]\n{"no_id": 1}\n{"id": [1]}\n{"id": "x"}\n')
    assert done_ids(path) == {"x"}  # not a row, no id, unhashable id: redone


# ---- build-once folders ----------------------------------------------------------------------
def test_failing_build_leaves_no_folder(tmp_path):
    path = str(tmp_path / "cache" / "thing")

    def broken(tmp):
        open(os.path.join(tmp, "half"), "w").close()
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        build_once(path, broken)
    assert os.listdir(tmp_path / "cache") == []  # neither the folder nor its temporary sibling


def test_second_call_does_not_rebuild(tmp_path):
    path, calls = str(tmp_path / "thing"), []

    def build(tmp):
        calls.append(tmp)
        with open(os.path.join(tmp, "data.txt"), "w") as f:
            f.write("built")
        return {"version": 1}

    assert build_once(path, build) == path and build_once(path, build) == path
    assert len(calls) == 1 and calls[0] != path
    assert open(os.path.join(path, "data.txt")).read() == "built"
    assert json.load(open(os.path.join(path, MARKER))) == {"version": 1}


def test_stale_folder_without_marker_is_rebuilt(tmp_path):
    path = tmp_path / "thing"
    path.mkdir()
    (path / "leftover").write_text("half-built by an older builder")
    build_once(str(path), lambda tmp: open(os.path.join(tmp, "fresh"), "w").close())
    assert sorted(os.listdir(path)) == sorted([MARKER, "fresh"])


# ---- environment variables -------------------------------------------------------------------
def readme_env_rows():
    with open(os.path.join(ROOT, "README.md")) as f:
        return [line.rstrip("\n") for line in f if line.startswith("| `SGLANG_DFLASH_")]


# Switches for debugging, fault injection, tests and internal state: env_debug.py, `--all` only.
INTERNAL = ("debug:", "fault injection:", "tests:", "internal:")
USER_MAX = 10  # README's table is what a serving engineer sets; the rest is `advanced` or below


def test_readme_table_is_env_py_user_level_and_vice_versa():
    rows = readme_env_rows()
    in_readme = {re.match(r"\| `(SGLANG_DFLASH_\w+)`", r).group(1) for r in rows}
    user = [v for v in env.ALL if v.level == env.USER]
    assert len(user) <= USER_MAX, f"{len(user)} user-level variables: mark the rarer ones level=ADVANCED"
    declared = {v.name for v in user}
    assert in_readme == declared, f"README only: {in_readme - declared}; env.py only: {declared - in_readme}"
    stale = [v.table_row() for v in user if v.table_row() not in rows]
    hint = "README rows differ from env.py; paste these rows of `python -m sglang_dflash.env`:\n"
    assert not stale, hint + "\n".join(stale)


def test_every_env_var_has_a_level_and_all_lists_it():
    from sglang_dflash import env_debug

    levels = (env.USER, env.ADVANCED, env.DEBUG, env.INTERNAL)
    assert all(v.level in levels for v in env.ALL), [v.name for v in env.ALL if v.level not in levels]
    below = [v for v in env.ALL if v.level in (env.DEBUG, env.INTERNAL)]
    assert below == env_debug.DECLARED, "debug, test and internal switches are declared in env_debug.py"
    assert all(v.meaning.startswith(INTERNAL) for v in below), "their meaning starts with debug:, tests:, ..."
    assert not any(v.meaning.startswith(INTERNAL) for v in env.DECLARED)
    assert len({v.name for v in env.ALL}) == len(env.ALL)
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "sglang_dflash.env", "--all"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert all(v.table_row() in out.stdout for v in env.ALL)


def test_every_env_var_named_in_the_code_is_declared():
    declared = {v.name for v in env.ALL}
    for path, text in sources(*PY_SOURCES, "setup.py", "Makefile"):
        retired = set(env.RETIRED) if path == "sglang_dflash/env.py" else set()  # refused there by name
        unknown = set(re.findall(r"SGLANG_DFLASH_[A-Z_]+", text)) - declared - retired
        assert not unknown, f"{path} uses {unknown}: declare them in sglang_dflash/env.py"


def test_cpu_ops_is_one_escape_hatch_and_the_retired_switches_are_refused(monkeypatch):
    monkeypatch.delenv(env.CPU_OPS.name, raising=False)
    assert {op: env.cpu_op(op) for op in env.CPU_OP_CHOICES} == dict.fromkeys(env.CPU_OP_CHOICES, "auto")
    monkeypatch.setenv(env.CPU_OPS.name, " Linear=0, stack=loop ,")
    assert env.cpu_op("linear") == "0" and env.cpu_op("stack") == "loop" and env.cpu_op("rope") == "auto"
    assert env.cpu_ops_with("linear=0,stack=loop", packed="1", stack="auto") == "linear=0,packed=1,stack=auto"
    for bad in ("stack=on", "gemm=0", "linear"):
        monkeypatch.setenv(env.CPU_OPS.name, bad)
        with pytest.raises(ValueError, match=f"SGLANG_DFLASH_CPU_OPS='{bad}'.*stack=auto\\|loop\\|0"):
            env.cpu_op("linear")
    monkeypatch.delenv(env.CPU_OPS.name)
    for old, op in env.RETIRED.items():
        monkeypatch.setenv(old, "0")
        with pytest.raises(ValueError, match=f"{old} was replaced by SGLANG_DFLASH_CPU_OPS.*CPU_OPS={op}=0"):
            env.cpu_op("attention")
        monkeypatch.delenv(old)


def test_env_vars_are_read_only_through_env_py():
    read = re.compile(r"""(os\.environ\.get\(|os\.getenv\(|os\.environ\[)\s*["']SGLANG_DFLASH_""")
    readers = [p for p, text in sources(*PY_SOURCES) if read.search(text)]
    assert readers == [], f"read these through sglang_dflash.env: {readers}"


def test_env_var_parsing(monkeypatch):
    monkeypatch.delenv(env.DEBUG_FAIL_DRAFT_EVERY.name, raising=False)
    assert env.DEBUG_FAIL_DRAFT_EVERY.get() == 0 and env.DEBUG_DUMP_DIR.get() is None
    monkeypatch.setenv(env.DEBUG_FAIL_DRAFT_EVERY.name, "3")
    monkeypatch.setenv(env.IMPL.name, " Builtin ")
    monkeypatch.setenv(env.REFERENCE_OPS.name, "1")
    assert env.DEBUG_FAIL_DRAFT_EVERY.get() == 3 and env.IMPL.get() == "builtin" and env.REFERENCE_OPS.get()
    monkeypatch.setenv(env.IMPL.name, "theirs")
    with pytest.raises(ValueError, match="SGLANG_DFLASH_IMPL='theirs'"):
        env.IMPL.get()
    monkeypatch.setenv(env.DEBUG_FAIL_DRAFT_EVERY.name, "often")
    with pytest.raises(ValueError, match="SGLANG_DFLASH_DEBUG_FAIL_DRAFT_EVERY"):
        env.DEBUG_FAIL_DRAFT_EVERY.get()


# ---- CPU serving settings --------------------------------------------------------------------
def test_cpu_serving_settings_are_defined_once():
    literal = re.compile(r"""["'](torch_native|SGLANG_USE_CPU_ENGINE)["']""")
    owners = [
        p for p, text in sources(*PY_SOURCES) if literal.search(text) and not os.path.basename(p).startswith("test_")
    ]
    assert owners == ["sglang_dflash/cpu_serving.py"], owners


def test_cpu_server_flags_and_engine_kwargs_agree():
    from sglang_dflash.cpu_serving import engine_kwargs, server_flags
    from sglang_dflash.launch import with_defaults

    assert server_flags(max_total_tokens=8192)["--max-total-tokens"] == "8192"
    assert server_flags()["--disable-cuda-graph"] is None and engine_kwargs()["disable_cuda_graph"] is True
    args = with_defaults(["--model-path", "m"], gpu=False)
    for flag, value in server_flags().items():
        i = args.index(flag)
        assert value is None or args[i + 1] == value


# ---- measured results ------------------------------------------------------------------------
def test_results_page_and_headline_are_generated_from_the_rows():
    """docs/results.md and the README's headline table are bench/results_page.py's output for the
    rows in bench/results/ (a hand edit or a new row without regenerating fails here)."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "bench/results_page.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr


# ---- greedy ------------------------------------------------------------------------------------
def test_greedy_is_defined_once():
    import torch

    from sglang_dflash.pipeline.target_sampling import samples

    assert [samples(t, k) for t, k in ((0.0, -1), (0.7, 1), (0.7, -1), (1.0, 50))] == [False, False, True, True]
    got = samples(torch.tensor([0.0, 0.7, 0.7, 1.0]), torch.tensor([-1, 1, -1, 50]))
    assert got.tolist() == [False, False, True, True]
    # nowhere else re-derives it from temperature and top_k
    rederived = re.compile(r"top_ks?_?(\.reshape\(-1\))?\s*[!=]=\s*1\b")
    found = [path for path, text in sources("sglang_dflash/**/*.py") if rederived.search(text)]
    assert found == ["sglang_dflash/pipeline/target_sampling.py"], found
