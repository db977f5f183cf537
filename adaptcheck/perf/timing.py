"""Timing a device callable correctly: warm-up, device events or synchronize, repetitions,
median and spread.

Responsibility: one function, :func:`time_callable`, that every step-5 micro-benchmark (and
the standalone benchmark scripts) uses, so that "how long does this take on the device" is
answered the same way for every backend:

* **What is timed.** Where the backend declares streams and its torch module has timing
  events (``backend.torch_api().Event(enable_timing=True)``), a sample is the device time
  between an event recorded before and one recorded after the calls, read after the end
  event has completed (``end.synchronize()`` then ``elapsed_time``). Elsewhere a sample is
  ``backend.synchronize()``, ``time.perf_counter()``, the calls, ``backend.synchronize()``,
  ``perf_counter()`` — the synchronize after the calls is what makes asynchronous work
  count; a timer without it would measure only the launch.
* **Warm-up.** ``warmup`` untimed-for-the-result calls (at least one) absorb one-off costs:
  kernel selection, lazy initialisation, allocator growth, page faults on first touch. Each
  is synchronized and timed anyway, because the fastest warm-up call is the estimate of the
  per-call time that sizes everything after it.
* **Inner loop.** A very short call would be dominated by the timer itself (an event pair
  or a synchronize costs microseconds), so a sample times ``inner`` back-to-back calls,
  enough to last ``min_sample_s``, and reports the time per call.
* **Repetitions.** Samples are taken until at least ``min_reps`` exist *and* ``budget_s`` of
  wall time has been spent on them, never more than ``max_reps``. So a long call gets
  ``min_reps`` samples and a short one as many as the budget allows.
* **Statistics.** Median (the figure reported), min, p10, p90, mean, and the spread
  ``(p90 - p10) / median``; quantiles interpolate linearly between order statistics (numpy's
  default), so they are defined for any sample count.

Nothing exotic is done between samples (no cache flush, no clock locking): a benchmark that
wants cold caches sizes its buffers beyond the caches, which says more than a flush does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adaptcheck.backends.base import Backend

EVENTS = "device events"
SYNC = "synchronize + perf_counter"

MAX_INNER = 1 << 16
"""Most calls batched into one sample (a call that takes nanoseconds still ends a sample)."""


def _events_api(backend: Backend) -> Any | None:
    """The torch device module when it can time with events, else None."""
    if not backend.has_streams:
        return None
    try:
        api = backend.torch_api()
    except Exception:  # noqa: BLE001 - no device module: fall back to synchronize
        return None
    return api if callable(getattr(api, "Event", None)) else None


def timer_name(backend: Backend) -> str:
    """How :func:`time_callable` times a repetition on this backend (the contract's ``timer``)."""
    return EVENTS if _events_api(backend) is not None else SYNC


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values (numpy's default method)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Timing:
    """Seconds per call of a timed callable: the samples and their statistics."""

    samples: tuple[float, ...]
    """Seconds per call, one per repetition (each already divided by ``inner``)."""
    inner: int = 1
    """Calls per repetition."""
    warmup: int = 0
    """Warm-up calls made before the first repetition."""
    timer: str = SYNC
    """How each repetition was timed (:data:`EVENTS` or :data:`SYNC`)."""
    estimate_s: float | None = None
    """Per-call time estimated during warm-up (fastest warm-up call)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a Timing needs at least one sample")

    @property
    def _sorted(self) -> list[float]:
        return sorted(self.samples)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return quantile(self._sorted, 0.5)

    @property
    def min(self) -> float:
        return self._sorted[0]

    @property
    def p10(self) -> float:
        return quantile(self._sorted, 0.1)

    @property
    def p90(self) -> float:
        return quantile(self._sorted, 0.9)

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median; inf when the median is not positive (a broken timing)."""
        med = self.median
        return (self.p90 - self.p10) / med if med > 0 else math.inf

    @property
    def valid(self) -> bool:
        """Every sample finite and positive (the contract's condition for not failing)."""
        return all(math.isfinite(s) and s > 0 for s in self.samples)

    def as_dict(self) -> dict[str, float | int]:
        """The contract's ``time_s`` mapping."""
        return {"median": self.median, "min": self.min, "p10": self.p10, "p90": self.p90, "mean": self.mean,
                "spread": self.spread, "n": self.n}


def summarize(samples: Sequence[float], **kw: Any) -> Timing:
    """A :class:`Timing` of samples measured elsewhere (e.g. by collective ranks)."""
    return Timing(samples=tuple(float(s) for s in samples), **kw)


def _sync_sample(fn: Callable[[], object], backend: Backend, index: int, inner: int) -> float:
    backend.synchronize(index)  # nothing queued before the sample may count towards it
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    backend.synchronize(index)  # asynchronous work counts only once the device says it is done
    return (time.perf_counter() - t0) / inner


def _event_sample(fn: Callable[[], object], api: Any, inner: int) -> float:
    start = api.Event(enable_timing=True)
    end = api.Event(enable_timing=True)
    start.record()
    for _ in range(inner):
        fn()
    end.record()
    end.synchronize()  # elapsed_time is only defined once the end event has completed
    return float(start.elapsed_time(end)) / 1e3 / inner


def time_callable(fn: Callable[[], object], backend: Backend, device_index: int = 0, *, warmup: int = 2,
                  min_reps: int = 5, max_reps: int = 200, budget_s: float = 1.0,
                  min_sample_s: float = 1e-3) -> Timing:
    """Time ``fn()`` on ``backend``'s device ``device_index``; see the module docstring.

    ``fn`` must queue the same work on every call (its result is discarded). ``budget_s``
    bounds the repetitions' wall time once ``min_reps`` are done; warm-up comes on top.
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got {min_reps}, {max_reps}")
    api = _events_api(backend)
    notes: list[str] = []
    # Warm-up: synchronized and timed by the host so it works the same on every backend;
    # the fastest one (first calls carry one-off costs) estimates the per-call time.
    warm_times: list[float] = []
    for i in range(max(1, warmup)):
        warm_times.append(_sync_sample(fn, backend, device_index, 1))
        # A call slower than the whole budget gets no second warm-up: the first already
        # paid the one-off costs, and repeating it would double the check's time.
        if i == 0 and warm_times[0] > budget_s and warmup > 1:
            notes.append(f"warm-up cut to 1 call: one call took {warm_times[0]:.3g} s (budget {budget_s:g} s)")
            break
    estimate = min(warm_times)
    inner = 1
    if estimate < min_sample_s:
        inner = min(MAX_INNER, max(1, math.ceil(min_sample_s / max(estimate, 1e-9))))
    samples: list[float] = []
    began = time.perf_counter()
    while len(samples) < max_reps:
        if api is not None:
            samples.append(_event_sample(fn, api, inner))
        else:
            samples.append(_sync_sample(fn, backend, device_index, inner))
        if len(samples) >= min_reps and time.perf_counter() - began >= budget_s:
            break
    return Timing(samples=tuple(samples), inner=inner, warmup=len(warm_times),
                  timer=EVENTS if api is not None else SYNC, estimate_s=estimate, notes=tuple(notes))
