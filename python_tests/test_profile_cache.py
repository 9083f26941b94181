"""The start-up step-cost profile's cache (srt/profile_cache.py): the same key loads the stored table
without measuring, any change to the key measures again, and a corrupt or foreign file is measured
again and overwritten, never a crash; a CPU profile measured beside another process's load is served
but not stored."""

import json
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

install_cpu_shims()  # without a GPU, SGLang's module-level sgl_kernel imports need these stand-ins
import torch  # noqa: E402

from sglang_dflash.pipeline.step_cost import CostTable  # noqa: E402
from sglang_dflash.srt import profile_cache  # noqa: E402

WIDTHS, SIZES = [1, 4], [1, 2, 4]


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(profile_cache, "CACHE_DIR", str(tmp_path / "cache"))
    for k in [k for k in os.environ if k.startswith("SGLANG_DFLASH_")]:
        monkeypatch.delenv(k)


def fake_worker(tmp_path, **over):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    if not (model / "config.json").exists():
        (model / "config.json").write_text('{"hidden_size": 64}')
    args = SimpleNamespace(
        model_path=str(model), speculative_draft_model_path="drafter", attention_backend="torch_native"
    )
    w = SimpleNamespace(
        model_runner=SimpleNamespace(dtype=torch.bfloat16, tp_rank=0, tp_size=1),
        server_args=args,
        device="cpu",
        device_type="cpu",
        block_size=16,
    )
    for k, v in over.items():
        setattr(w, k, v)
    return w


class Measure:
    """A profile whose cost is (scale + bs * w) ms; counts how often it measures."""

    def __init__(self, scale=1.0):
        self.calls, self.scale = 0, scale

    def __call__(self, worker, widths, sizes):
        self.calls += 1
        return CostTable(sizes, widths, {(b, w): (self.scale + b * w) / 1000 for b in sizes for w in widths})


def test_same_key_loads_the_stored_table_without_measuring(tmp_path, caplog):
    worker, measure = fake_worker(tmp_path), Measure()
    with caplog.at_level(logging.INFO, logger="sglang_dflash"):
        first = profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
        assert "profile measured" in caplog.text
        second = profile_cache.cached_costs(worker, WIDTHS, SIZES, Measure(scale=99.0))
    assert measure.calls == 1
    assert "profile loaded from" in caplog.text
    assert second.table == first.table  # the stored numbers, not the second measure's
    assert second.batch_sizes == SIZES and second.widths == WIDTHS


@pytest.mark.parametrize(
    "change",
    [
        lambda w, tmp, mp: setattr(w, "block_size", 8),
        lambda w, tmp, mp: setattr(w.model_runner, "dtype", torch.float32),
        lambda w, tmp, mp: setattr(w.server_args, "speculative_draft_model_path", "other-drafter"),
        lambda w, tmp, mp: (tmp / "model" / "config.json").write_text('{"hidden_size": 128}'),
        lambda w, tmp, mp: mp.setattr(torch, "get_num_threads", lambda: 97),
        lambda w, tmp, mp: mp.setattr(profile_cache, "_cpu", lambda: {"flags": "other host"}),
        lambda w, tmp, mp: mp.setattr(profile_cache, "_version", lambda dist: "9.9.9"),
        lambda w, tmp, mp: mp.setenv("SGLANG_DFLASH_CPU_OPS", "linear=0"),
        lambda w, tmp, mp: setattr(w, "device_type", "xpu"),
        lambda w, tmp, mp: mp.setattr(profile_cache, "_sources", lambda: "an edited checkout"),
    ],
    ids=["block", "dtype", "drafter", "model-config", "threads", "cpu", "version", "env", "device", "sources"],
)
def test_any_key_change_measures_again(tmp_path, monkeypatch, change):
    worker, measure = fake_worker(tmp_path), Measure()
    profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
    change(worker, tmp_path, monkeypatch)
    profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
    assert measure.calls == 2


def test_other_widths_or_batch_sizes_measure_again(tmp_path):
    worker, measure = fake_worker(tmp_path), Measure()
    profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
    profile_cache.cached_costs(worker, [1, 2, 4], SIZES, measure)
    profile_cache.cached_costs(worker, WIDTHS, [1, 2], measure)
    assert measure.calls == 3


@pytest.mark.parametrize("content", ["{not json", '{"key": 1}', "", '{"seconds": [[1]]}'])
def test_a_corrupt_file_is_measured_again_and_replaced(tmp_path, caplog, content):
    worker, measure = fake_worker(tmp_path), Measure()
    profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
    path = profile_cache.cache_path(profile_cache.profile_key(worker, WIDTHS, SIZES))
    with open(path, "w") as f:
        f.write(content)
    table = profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
    assert measure.calls == 2
    assert table.profiled(1, 1) == pytest.approx(0.002)
    with open(path) as f:
        assert json.load(f)["seconds"]  # rewritten whole
    profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
    assert measure.calls == 2


def test_a_file_of_another_key_under_this_name_is_not_trusted(tmp_path):
    worker, measure = fake_worker(tmp_path), Measure()
    profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
    path = profile_cache.cache_path(profile_cache.profile_key(worker, WIDTHS, SIZES))
    with open(path) as f:
        saved = json.load(f)
    saved["key"]["block_size"] = 4
    with open(path, "w") as f:
        json.dump(saved, f)
    profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
    assert measure.calls == 2


def test_an_unwritable_cache_still_serves_the_measured_profile(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(profile_cache, "CACHE_DIR", str(blocker / "cache"))
    worker, measure = fake_worker(tmp_path), Measure()
    table = profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
    assert table.profiled(2, 4) == pytest.approx(0.009)
    profile_cache.cached_costs(worker, WIDTHS, SIZES, measure)
    assert measure.calls == 2


def test_an_edit_to_the_packages_code_changes_the_source_stamp(tmp_path, monkeypatch):
    pkg = tmp_path / "sglang_dflash"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "srt" / "profile_cache.py").write_text("x = 1\n")
    (pkg / "pipeline.py").write_text("y = 1\n")
    monkeypatch.setattr(profile_cache, "__file__", str(pkg / "srt" / "profile_cache.py"))
    before = profile_cache._sources()
    assert profile_cache._sources() == before
    (pkg / "pipeline.py").write_text("y = 22\n")
    assert profile_cache._sources() != before


class BusyMeasure(Measure):
    """A profile during which another process burns a core of this host for a second and a half."""

    def __call__(self, worker, widths, sizes):
        burn = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"
        subprocess.run([sys.executable, "-c", burn], check=True)
        return super().__call__(worker, widths, sizes)


def test_a_profile_measured_beside_other_load_is_served_not_stored(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: len(os.sched_getaffinity(0)))  # no core to spare
    worker, busy = fake_worker(tmp_path), BusyMeasure()
    with caplog.at_level(logging.INFO, logger="sglang_dflash"):
        table = profile_cache.cached_costs(worker, WIDTHS, SIZES, busy)
    assert table.table == Measure()(worker, WIDTHS, SIZES).table  # served all the same
    assert "served, not cached" in caplog.text
    assert not os.path.exists(profile_cache.cache_path(profile_cache.profile_key(worker, WIDTHS, SIZES)))
    quiet = Measure(scale=5.0)
    profile_cache.cached_costs(worker, WIDTHS, SIZES, quiet)  # the next start measures again, and stores
    assert quiet.calls == 1
    assert (
        profile_cache.cached_costs(worker, WIDTHS, SIZES, Measure(scale=99.0)).table
        == quiet(worker, WIDTHS, SIZES).table
    )


def test_a_gpu_profile_is_stored_whatever_the_host_cpu_load(tmp_path, monkeypatch):
    """A GPU step's cost is the GPU's: host processes beside it do not make its table wrong."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake GPU")
    worker, busy = fake_worker(tmp_path, device="cuda:0", device_type="cuda"), BusyMeasure()
    profile_cache.cached_costs(worker, WIDTHS, SIZES, busy)
    assert os.path.exists(profile_cache.cache_path(profile_cache.profile_key(worker, WIDTHS, SIZES)))
