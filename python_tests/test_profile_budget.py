"""The start-up profile's time budget (srt/step_profile.profile_costs): batch sizes it cannot reach
in time are left out and extrapolated by the cost table; repeat passes stop when the budget does."""

from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

install_cpu_shims()  # without a GPU, SGLang's module-level sgl_kernel imports need these stand-ins
from sglang_dflash.srt.step_profile import profile_costs  # noqa: E402


class FakeHost:
    """A step costs (1 + bs * w) ms on a clock that only steps advance."""

    def __init__(self):
        self.now, self.calls = 0.0, []

    def clock(self):
        return self.now

    def step(self, worker, bs, w):
        self.calls.append((bs, w))
        t = (1 + bs * w) / 1000
        self.now += t
        return t


def test_a_large_budget_measures_every_cell_three_times():
    host = FakeHost()
    table = profile_costs(None, [1, 4], [1, 2, 4], budget_s=1e6, step=host.step, clock=host.clock)
    assert table.batch_sizes == [1, 2, 4]
    assert len(host.calls) == 3 + 3 * 3 * 2  # a warm-up per bs, then three passes over the grid


def test_a_small_budget_stops_before_a_row_that_would_pass_it_and_extrapolates():
    host = FakeHost()
    sizes = [1, 2, 4, 8, 16, 32, 48]
    table = profile_costs(None, [1, 8, 16], sizes, budget_s=0.7, step=host.step, clock=host.clock)
    assert table.batch_sizes == [1, 2, 4, 8]  # the bs-16 row would end past 0.7 s
    assert not any(bs > 8 for bs, _ in host.calls)
    assert host.now <= 0.7
    lo, hi = table.profiled(4, 16), table.profiled(8, 16)
    assert abs(table.profiled(48, 16) - (hi + (hi - lo) * (48 - 8) / 4)) < 1e-12
    assert abs(table.profiled(48, 16) - (1 + 48 * 16) / 1000) < 1e-9  # linear costs extrapolate exactly
