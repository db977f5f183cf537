"""The host-speed probe: it times a fixed workload per core, puts the thread back, and never raises."""

from __future__ import annotations

import os
import sys

import pytest

from adaptcheck.perf import hostspeed
from adaptcheck.perf.hostspeed import HostSpeedProbe, probe_cores

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CPU affinity is Linux's")


def test_probe_cores_are_evenly_spaced_and_bounded() -> None:
    assert probe_cores({3, 1, 2}) == [1, 2, 3]
    assert probe_cores(set(range(16)), limit=4) == [0, 4, 8, 12]
    assert probe_cores(set(range(0, 64, 2)), limit=4) == [0, 16, 32, 48]


@linux
def test_the_probe_times_every_probed_core_and_puts_the_thread_back() -> None:
    before = os.sched_getaffinity(0)
    probe = HostSpeedProbe()
    times = probe.per_core()
    assert probe.unavailable is None and times is not None
    assert set(times) == set(probe.cores) == set(probe_cores(before))
    assert all(0 < t < 1000 for t in times.values())
    assert os.sched_getaffinity(0) == before
    m = probe.measure()
    assert m is not None and 0 < m < 1000


@linux
def test_the_figure_grows_with_the_work() -> None:
    # Larger is slower: 8x the elements (still a fixed workload) must read as a much slower host.
    small = min(HostSpeedProbe(elements=1 << 16).measure() or 0.0 for _ in range(3))
    large = min(HostSpeedProbe(elements=1 << 19).measure() or 0.0 for _ in range(3))
    assert small > 0 and large > 3 * small


@linux
def test_a_probe_that_cannot_pin_says_why_and_returns_none(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = HostSpeedProbe()
    real = os.sched_setaffinity

    def refuse(pid: int, cpus: object) -> None:
        if len(cpus) == 1:  # type: ignore[arg-type]
            raise OSError(22, "Invalid argument")
        real(pid, cpus)  # type: ignore[arg-type]

    before = os.sched_getaffinity(0)
    monkeypatch.setattr(hostspeed.os, "sched_setaffinity", refuse)
    assert probe.measure() is None and probe.unavailable and "Invalid argument" in probe.unavailable
    assert os.sched_getaffinity(0) == before


def test_a_probe_without_numpy_is_absent_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy now raises ImportError
    probe = HostSpeedProbe()
    assert probe.measure() is None and probe.unavailable and probe.unavailable.startswith("host-speed probe not run")
