"""Step graphs (pipeline/step_graphs.py): buckets, padding into static buffers, one capture per
shape, replays cut back to the batch, and fallbacks counted by reason; the fake backend records
what the cache asked of it."""

import pytest
import torch

from sglang_dflash.pipeline.step_graphs import CompiledGraphs, EagerGraphs, StepGraphs, capture_buckets
from sglang_dflash.testing.fake_graphs import FakeGraphs

PADS = {"ids": -1, "x": 0.0, "opt": 0.0}
SEEN = []  # every padded batch the step function saw


def step(ids, x, opt):
    """Row-independent, like a draft step: row i's outputs read row i's inputs only."""
    SEEN.append(ids.clone())
    y = x * 2 + ids[:, None]
    return y, None if opt is None else opt + 1, ids.clone()


def inputs(bs, with_opt=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "ids": torch.randint(0, 100, (bs,), generator=g),
        "x": torch.randn(bs, 3, generator=g),
        "opt": torch.randn(bs, 2, generator=g) if with_opt else None,
    }


def test_capture_buckets_follow_sglangs_list_and_cap():
    assert capture_buckets([8, 1, 2, 4, 4, 16], 8) == [1, 2, 4, 8]
    assert capture_buckets([1, 2, 4], None) == [1, 2, 4]
    assert capture_buckets(None, 4) == []


@pytest.mark.parametrize("bs", [1, 3, 4, 5])  # 1, inside a bucket, a bucket edge, one above it
def test_padded_replay_equals_the_eager_step(bs):
    fake = FakeGraphs()
    graphs = StepGraphs([1, 4, 8], fake)
    SEEN.clear()
    for seed in range(3):
        inp = inputs(bs, seed=seed)
        got = graphs.run(step, inp, PADS, key=(4,))
        want = step(**inp)
        assert torch.equal(got[0], want[0]) and got[1] is None and torch.equal(got[2], want[2])
    bucket = graphs.bucket(bs)
    assert fake.captured == 1 and fake.replayed == 3 and graphs.counts == {"captured": 1, "replayed": 3}
    padded = SEEN[-2]  # the replay's view (the last entry is the eager reference's own call)
    assert padded.shape == (bucket,) and (padded[bs:] == -1).all()


def test_one_capture_per_shape_and_smaller_batches_repad():
    fake = FakeGraphs()
    graphs = StepGraphs([2, 4], fake)
    SEEN.clear()
    graphs.run(step, inputs(4), PADS, key=(4,))
    graphs.run(step, inputs(3, seed=1), PADS, key=(4,))  # the same bucket: rows 3.. padded again
    assert (SEEN[-1][3:] == -1).all() and fake.captured == 1
    graphs.run(step, inputs(3), PADS, key=(8,))  # another width: another shape
    graphs.run(step, inputs(3, with_opt=True), PADS, key=(8,))  # an optional input present: another
    out = graphs.run(step, inputs(2, with_opt=True), PADS, key=(8,))
    assert fake.captured == 4 and len(graphs.entries) == 4
    assert torch.equal(out[1], inputs(2, with_opt=True)["opt"] + 1)


def test_fallbacks_are_counted_and_a_failed_shape_is_not_recaptured():
    graphs = StepGraphs([1, 2], FakeGraphs())
    inp = inputs(3)
    out = graphs.run(step, inp, PADS)
    assert torch.equal(out[0], step(**inp)[0])
    assert graphs.counts["fallback:batch above the largest bucket"] == 1
    broken = FakeGraphs(fail_capture=True)
    graphs = StepGraphs([4], broken)
    for _ in range(3):
        out = graphs.run(step, inp, PADS)
        assert torch.equal(out[0], step(**inp)[0])
    assert graphs.counts["fallback:capture failed"] == 3 and broken.captured == 0 and not graphs.entries


def test_eager_backend_is_the_cpu_twin():
    graphs = StepGraphs([8], EagerGraphs())
    for bs in (1, 5, 8):
        inp = inputs(bs, with_opt=True, seed=bs)
        got, want = graphs.run(step, inp, PADS), step(**inp)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert graphs.counts == {"captured": 1, "replayed": 3}


def test_compiled_backend_replays_a_compiled_step():
    """CompiledGraphs: one compile per shape (at capture), replays equal to the eager step."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    graphs = StepGraphs([8], CompiledGraphs())
    for bs in (1, 5, 8):
        inp = inputs(bs, with_opt=True, seed=bs)
        got, want = graphs.run(step, inp, PADS), step(**inp)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert graphs.counts == {"captured": 1, "replayed": 3}
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo traced the step (compiled, not eager)


def test_a_shape_first_seen_under_inference_mode_serves_later_steps():
    """The start-up profile runs under inference mode; the scheduler's steps do not."""
    graphs = StepGraphs([4], EagerGraphs())
    with torch.inference_mode():
        graphs.run(step, inputs(2), PADS)
    inp = inputs(3, seed=2)
    got = graphs.run(step, inp, PADS)
    assert torch.equal(got[0], step(**inp)[0]) and graphs.counts == {"captured": 1, "replayed": 2}


class Plan:
    """A prepare(state, fixed, **inputs) that records where and on what it ran (FlashInfer's plan)."""

    def __init__(self):
        self.calls, self.made = [], []

    def __call__(self, state, fixed, ids, x, opt):
        if state is None:
            state = {"fixed": fixed, "bs": ids.shape[0]}
            self.made.append(state)
        state["ids"] = ids.clone()  # what the step will attend over: planned from these inputs
        self.calls.append((fixed, ids.shape[0], FakeGraphs.capturing))
        return state


def planned_step(state, ids, x, opt):
    assert torch.equal(state["ids"], ids), "the step ran on a plan made for other inputs"
    return step(ids, x, opt)


def test_prepare_runs_outside_the_capture_before_every_replay_with_one_state_per_bucket():
    plan, fake = Plan(), FakeGraphs()
    graphs = StepGraphs([2, 4], fake)
    for bs, width in ((3, 4), (4, 4), (3, 8), (1, 4)):
        inp = inputs(bs, seed=bs + width)
        got = graphs.run(planned_step, inp, PADS, key=(width,), prepare=plan)
        assert torch.equal(got[0], step(**inp)[0])
    assert fake.captured == 3 and fake.replayed == 4
    assert not any(capturing for _, _, capturing in plan.calls), "the plan ran inside a captured region"
    # one fixed state per bucket (4 and 2), shared by that bucket's widths, sized to the bucket
    assert [(s["fixed"], s["bs"]) for s in plan.made] == [(True, 4), (True, 2)]
    # above the largest bucket: a fresh, unfixed plan on the batch's own rows
    inp = inputs(5, seed=9)
    assert torch.equal(graphs.run(planned_step, inp, PADS, key=(4,), prepare=plan)[0], step(**inp)[0])
    assert (plan.made[-1]["fixed"], plan.made[-1]["bs"]) == (False, 5)


class StaleGraphs(FakeGraphs):
    """A backend whose replays return what the capture returned (a graph that read the wrong memory)."""

    def capture(self, fn):
        self.captured += 1
        return tuple(None if o is None else o.clone() for o in fn())

    def replay(self, handle):
        self.replayed += 1
        return handle


def test_a_first_replay_that_differs_from_the_eager_step_is_caught_and_never_replayed_again():
    stale = StaleGraphs()
    graphs = StepGraphs([4], stale, check_first=True)
    for seed in range(3):
        inp = inputs(3, seed=seed)
        got = graphs.run(step, inp, PADS)
        assert torch.equal(got[0], step(**inp)[0]) and torch.equal(got[2], inp["ids"])
    assert graphs.counts == {"captured": 1, "fallback:replay differed": 3}
    assert stale.captured == 1 and stale.replayed == 1
    good = StepGraphs([4], FakeGraphs(), check_first=True)
    for seed in range(3):
        good.run(step, inputs(3, seed=seed), PADS)
    assert good.counts == {"captured": 1, "replayed": 3}


def test_a_prepare_that_returns_a_new_state_is_refused():
    """A captured step holds the state object it was captured with: a new one would never be read."""
    graphs = StepGraphs([4], EagerGraphs())
    fresh = lambda state, fixed, ids, x, opt: {"ids": ids.clone()}  # noqa: E731
    with pytest.raises(RuntimeError, match="re-plan the state it is given in place"):
        graphs.run(planned_step, inputs(3), PADS, prepare=fresh)
