"""A step-graph backend for tests: records every capture and replay (and can refuse to capture),
so the cache's bookkeeping is checked without a GPU."""

from __future__ import annotations


class FakeGraphs:
    name = "fake"

    def __init__(self, fail_capture: bool = False):
        self.fail_capture = fail_capture
        self.captured = 0
        self.replayed = 0

    capturing = False  # True while any FakeGraphs captures: what runs then runs inside a graph

    def capture(self, fn):
        if self.fail_capture:
            raise RuntimeError("fake capture refused")
        FakeGraphs.capturing = True
        try:
            self.captured += 1
            return fn
        finally:
            FakeGraphs.capturing = False

    def replay(self, handle):
        self.replayed += 1
        return handle()
