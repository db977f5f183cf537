"""adaptcheck.perf.timing: the timer waits for asynchronous work, reads events only once they
completed, divides batched calls correctly, and its statistics match their definitions.

The devices here are fakes whose work is asynchronous by construction:

* :class:`LazyDevice` queues work and runs it only when someone synchronizes (as a GPU
  runs kernels after the launch returns); a timer that forgets ``synchronize`` measures the
  enqueue alone and leaves the work pending — which the tests see without timing anything.
* :class:`VirtualDevice` has a virtual clock: each call advances it by a known cost, and its
  events stamp that clock. Event timings are then exact numbers, and ``elapsed_time`` raises
  on an event that has not completed (as CUDA does), so a timer that reads an event before
  synchronizing on it fails loudly.

No assertion depends on how fast this machine is: only lower bounds guaranteed by
``time.sleep`` and exact virtual-clock values.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, ClassVar

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.perf.timing import (
    EVENTS,
    SYNC,
    Timing,
    quantile,
    summarize,
    time_callable,
    timer_name,
)

# --- fake devices -------------------------------------------------------------------------

class LazyDevice(CpuBackend):
    """A device whose work runs only at synchronize: ``submit`` returns at once."""

    name = "lazy"
    has_streams = False

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s
        self.pending = 0
        self.done = 0

    def submit(self) -> None:
        self.pending += 1

    def synchronize(self, index: int = 0) -> None:
        while self.pending:
            time.sleep(self.cost_s)  # "the kernel runs"
            self.pending -= 1
            self.done += 1


class ForgetfulDevice(LazyDevice):
    """The bug under test: a synchronize that does not wait (as a timer without one)."""

    name = "forgetful"

    def synchronize(self, index: int = 0) -> None:
        pass


class VirtualEvent:
    def __init__(self, device: VirtualDevice, enable_timing: bool = False) -> None:
        self.device = device
        self.enable_timing = enable_timing
        self.stamp: float | None = None

    def record(self, stream: Any = None) -> None:
        self.device.queue.append(("event", self))

    def synchronize(self) -> None:
        self.device.run_until(self)

    def elapsed_time(self, end: VirtualEvent) -> float:
        if self.stamp is None or end.stamp is None:
            raise RuntimeError("event has not been recorded or has not completed")  # as torch.cuda does
        return (end.stamp - self.stamp) * 1e3  # milliseconds


class VirtualDevice(CpuBackend):
    """Queued work on a virtual clock; events stamp it when the queue reaches them."""

    name = "virtual"
    has_streams: ClassVar[bool] = True  # type: ignore[misc]

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s
        self.clock = 0.0
        self.queue: list[tuple[str, Any]] = []
        self.events_read = 0
        device = self

        class Api:
            @staticmethod
            def Event(enable_timing: bool = False) -> VirtualEvent:
                return VirtualEvent(device, enable_timing)

        self.api = Api

    def torch_api(self) -> Any:
        return self.api

    def submit(self) -> None:
        self.queue.append(("work", None))

    def _run_one(self) -> None:
        kind, obj = self.queue.pop(0)
        if kind == "work":
            self.clock += self.cost_s
        else:
            obj.stamp = self.clock

    def run_until(self, event: VirtualEvent) -> None:
        while event.stamp is None and self.queue:
            self._run_one()

    def synchronize(self, index: int = 0) -> None:
        while self.queue:
            self._run_one()


class NoEventApi(CpuBackend):
    """Declares streams, but its torch module has no Event: the timer must fall back."""

    name = "noevents"
    has_streams: ClassVar[bool] = True  # type: ignore[misc]

    def torch_api(self) -> Any:
        return object()


# --- synchronize path ---------------------------------------------------------------------

def test_synchronize_timer_waits_for_asynchronous_work() -> None:
    dev = LazyDevice(cost_s=0.02)
    t = time_callable(dev.submit, dev, warmup=1, min_reps=3, max_reps=3, budget_s=0.0)
    assert t.timer == SYNC
    assert dev.pending == 0, "work was still queued when the timer returned"
    # Every repetition covered at least the work it queued (sleep never returns early).
    assert t.min >= 0.02
    assert dev.done == 1 + 3 * t.inner


def test_a_timer_that_does_not_synchronize_is_caught() -> None:
    """The same measurement through a device whose synchronize does not wait leaves the
    work pending and reports less than the work costs: the contrast above is the test."""
    dev = ForgetfulDevice(cost_s=0.2)
    t = time_callable(dev.submit, dev, warmup=1, min_reps=3, max_reps=3, budget_s=0.0)
    assert dev.pending > 0 and dev.done == 0
    assert t.median < 0.2  # it measured the enqueue, not the 0.2 s of work


def test_short_calls_are_batched_and_divided() -> None:
    """A call far below min_sample_s is repeated inside each sample; samples are per call."""
    dev = LazyDevice(cost_s=0.0)
    t = time_callable(dev.submit, dev, warmup=1, min_reps=2, max_reps=2, budget_s=0.0, min_sample_s=0.01)
    assert t.inner > 1
    assert dev.done == 1 + 2 * t.inner
    assert t.n == 2


def test_repetitions_respect_min_max_and_budget() -> None:
    dev = LazyDevice(cost_s=0.0)
    assert time_callable(dev.submit, dev, min_reps=4, max_reps=50, budget_s=0.0).n == 4
    assert time_callable(dev.submit, dev, min_reps=4, max_reps=4, budget_s=10.0).n == 4
    t = time_callable(dev.submit, dev, min_reps=2, max_reps=1000, budget_s=0.05)
    assert 2 <= t.n <= 1000
    with pytest.raises(ValueError):
        time_callable(dev.submit, dev, min_reps=0)
    with pytest.raises(ValueError):
        time_callable(dev.submit, dev, min_reps=5, max_reps=4)


def test_a_call_longer_than_the_budget_gets_one_warmup() -> None:
    dev = LazyDevice(cost_s=0.05)
    t = time_callable(dev.submit, dev, warmup=3, min_reps=1, max_reps=1, budget_s=0.01)
    assert t.warmup == 1 and t.notes and "warm-up cut" in t.notes[0]


# --- events path --------------------------------------------------------------------------

def test_event_timer_reads_completed_events_and_measures_device_time() -> None:
    dev = VirtualDevice(cost_s=0.004)
    t = time_callable(dev.submit, dev, warmup=2, min_reps=5, max_reps=5, budget_s=0.0, min_sample_s=0.0)
    assert t.timer == EVENTS == timer_name(dev)
    assert t.inner == 1
    assert all(math.isclose(s, 0.004, rel_tol=1e-9) for s in t.samples)


def test_event_timer_divides_batched_calls() -> None:
    dev = VirtualDevice(cost_s=2e-6)
    t = time_callable(dev.submit, dev, warmup=1, min_reps=3, max_reps=3, budget_s=0.0, min_sample_s=1e-3)
    assert t.inner > 1  # the host estimate of a virtual call is tiny
    assert all(math.isclose(s, 2e-6, rel_tol=1e-9) for s in t.samples)


def test_reading_an_event_before_it_completed_raises() -> None:
    """The fake is faithful: what a careless timer would do fails (so the test above means
    the real timer synchronized on the end event before reading it)."""
    dev = VirtualDevice(cost_s=0.001)
    start, end = dev.api.Event(enable_timing=True), dev.api.Event(enable_timing=True)
    start.record()
    dev.submit()
    end.record()
    with pytest.raises(RuntimeError):
        start.elapsed_time(end)
    end.synchronize()
    assert math.isclose(start.elapsed_time(end), 1.0)


def test_timer_name_follows_capabilities() -> None:
    assert timer_name(CpuBackend()) == SYNC
    assert timer_name(VirtualDevice(0.0)) == EVENTS
    assert timer_name(NoEventApi()) == SYNC  # streams declared, no Event in its module


def test_real_cpu_callable_times_positive() -> None:
    import torch

    a = torch.randn(64, 64)
    t = time_callable(lambda: a @ a, CpuBackend(), warmup=1, min_reps=3, max_reps=3, budget_s=0.0)
    assert t.valid and t.n == 3 and t.timer == SYNC


# --- statistics ---------------------------------------------------------------------------

def test_statistics_match_their_definitions() -> None:
    samples = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 7.0, 6.0, 9.0, 8.0]
    t = summarize(samples)
    ordered = sorted(samples)
    # numpy's default percentile = statistics.quantiles(method="inclusive")
    deciles = statistics.quantiles(ordered, n=10, method="inclusive")
    assert t.median == statistics.median(samples) == 5.5
    assert math.isclose(t.p10, deciles[0]) and math.isclose(t.p90, deciles[-1])
    assert t.min == 1.0 and t.mean == 5.5 and t.n == 10
    assert math.isclose(t.spread, (t.p90 - t.p10) / t.median)
    assert set(t.stats().dump()) == {"median", "min", "p10", "p90", "mean", "spread", "n", "median_ci", "ci_level",
                                "ci_rel_width", "ci_target", "settled"}
    # n = 10: the 95 % order-statistic CI of the median is [x_(2), x_(9)], coverage 1 - 2·11/1024.
    assert t.stats().dump()["median_ci"] == [2.0, 9.0] and math.isclose(t.stats().dump()["ci_level"], 1 - 22 / 1024)


def test_quantile_edges_and_validity() -> None:
    assert quantile([3.0], 0.9) == 3.0
    assert quantile([1.0, 2.0], 0.5) == 1.5
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        Timing(samples=())
    assert not summarize([0.0, 1.0]).valid
    assert not summarize([float("nan")]).valid
    assert summarize([0.0]).spread == math.inf
