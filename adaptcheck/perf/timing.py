"""Timing a device callable correctly — warm-up, device events or synchronize, an inner loop,
adaptive repetitions, the median with its distribution-free confidence interval — in one
function, :func:`time_callable`, that every step-5 micro-benchmark and benchmark script uses.
Method and statistics: docs/perf.md ("Timing a device callable", "Micro-benchmark timing").
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adaptcheck.base.schemas.micro_evidence import TimeStats

if TYPE_CHECKING:
    from adaptcheck.backends.base import Backend

EVENTS = "device events"
SYNC = "synchronize + perf_counter"

MAX_INNER = 1 << 16
"""Most calls batched into one sample (a call that takes nanoseconds still ends a sample)."""

CI_LEVEL = 0.95
"""Confidence of the median's interval."""
CI_TARGET = 0.02
"""Default: sampling stops once the median's CI is narrower than 2 % of the median (±1 %)."""


def median_ci(sorted_values: Sequence[float], level: float = CI_LEVEL) -> tuple[float, float, float]:
    """(low, high, coverage) of the distribution-free CI of the median of sorted samples (see
    the module docstring); coverage < ``level`` only when there are too few samples."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("CI of no values")
    alpha_half = (1.0 - level) / 2.0

    def below(rank: int) -> float:  # P(X < rank), X ~ Binomial(n, 1/2): the chance x_(rank) is above the median
        return sum(math.comb(n, k) for k in range(rank)) / 2.0 ** n

    rank = 1
    while rank + 1 <= (n + 1) // 2 and below(rank + 1) <= alpha_half:
        rank += 1
    tail = below(rank)
    return sorted_values[rank - 1], sorted_values[n - rank], 1.0 - 2.0 * tail


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
    ci_target: float | None = None
    """Relative CI width sampling aimed at (None: samples measured elsewhere, no target)."""

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
    def median_ci(self) -> tuple[float, float, float]:
        """(low, high, coverage) of the median's distribution-free CI (:func:`median_ci`)."""
        return median_ci(self._sorted)

    @property
    def ci_rel_width(self) -> float:
        """(high - low) / median of the median's CI; inf when the median is not positive."""
        lo, hi, _ = self.median_ci
        med = self.median
        return (hi - lo) / med if med > 0 else math.inf

    @property
    def settled(self) -> bool:
        """The median's CI reached its target width at full confidence (False without a target)."""
        _, _, coverage = self.median_ci
        return (self.ci_target is not None and coverage >= CI_LEVEL and self.ci_rel_width <= self.ci_target)

    @property
    def valid(self) -> bool:
        """Every sample finite and positive (the contract's condition for not failing)."""
        return all(math.isfinite(s) and s > 0 for s in self.samples)

    def stats(self) -> TimeStats:
        """The contract's ``time_s`` record."""
        lo, hi, coverage = self.median_ci
        return TimeStats(median=self.median, min=self.min, p10=self.p10, p90=self.p90, mean=self.mean,
                         spread=self.spread, n=self.n, median_ci=(lo, hi), ci_level=coverage,
                         ci_rel_width=self.ci_rel_width, ci_target=self.ci_target, settled=self.settled)


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
                  min_sample_s: float = 1e-3, ci_target: float | None = CI_TARGET) -> Timing:
    """Time ``fn()`` on ``backend``'s device ``device_index``; see the module docstring.

    ``fn`` must queue the same work on every call (its result is discarded). ``budget_s``
    bounds the repetitions' wall time once ``min_reps`` are done; warm-up comes on top.
    ``ci_target``: stop early once the median's 95 % CI is narrower than this fraction of the
    median (None: always spend the budget).
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
        if len(samples) >= min_reps:
            if time.perf_counter() - began >= budget_s:
                break
            # The check sorts the samples: every sample while few, every 16th beyond 64.
            if ci_target is not None and (len(samples) < 64 or len(samples) % 16 == 0) \
                    and _settled(samples, ci_target):
                break
    timing = Timing(samples=tuple(samples), inner=inner, warmup=len(warm_times),
                    timer=EVENTS if api is not None else SYNC, estimate_s=estimate, notes=tuple(notes),
                    ci_target=ci_target)
    if ci_target is not None and not timing.settled:
        coverage = timing.median_ci[2]
        notes.append(f"median not settled: its {coverage:.0%} CI spans {timing.ci_rel_width:.1%} of it after "
                     f"{timing.n} repetitions (target {ci_target:.0%}; budget or max_reps reached)")
        timing = dataclasses.replace(timing, notes=tuple(notes))
    return timing


def _settled(samples: Sequence[float], target: float) -> bool:
    """The median of ``samples`` has a full-confidence CI narrower than ``target`` of it."""
    ordered = sorted(samples)
    lo, hi, coverage = median_ci(ordered)
    med = quantile(ordered, 0.5)
    return coverage >= CI_LEVEL and med > 0 and (hi - lo) / med <= target
