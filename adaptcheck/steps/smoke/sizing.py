"""Sizing work to the device: measure how fast it is, then pick the largest size that fits.

The method: docs/smoke.md (Sizing work to the device).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from adaptcheck.base.schemas.smoke_evidence import RateProbeFacts


@dataclass(frozen=True)
class RateProbe:
    """One timed run of a sized workload: its size, seconds and work (FLOP or bytes)."""

    size: int
    seconds: float
    work: float

    @property
    def rate(self) -> float:
        """Work per second (FLOP/s for matmuls). Seconds are floored so a 0-duration timer
        reading gives a huge rate, never a division by zero."""
        return self.work / max(self.seconds, 1e-9)

    def evidence(self) -> RateProbeFacts:
        return RateProbeFacts(size=self.size, seconds=self.seconds, rate=self.rate)


def probe_rate(
    run: Callable[[int], float],
    work: Callable[[int], float],
    start: int,
    limit: int,
    target_s: float,
    growth: int = 2,
    confirm: bool = True,
) -> RateProbe:
    """Time ``run(size)`` from ``start``, multiplying the size by ``growth`` while one run
    takes less than ``target_s`` and the grown size stays ≤ ``limit``.

    ``run`` returns the seconds of one run (the caller warms the device up first). The last
    run is at most about growth^p × ``target_s`` for a workload of cost ∝ size^p, and the
    earlier ones add a geometric tail, so the probe stays a small share of the budget
    however slow or fast the device is: use growth 2 for cubic (n×n×n) workloads and 4 for
    linear ones (a growing K) so that each step multiplies the cost by 8 and 4.

    With ``confirm`` the final size is timed once more and the faster reading kept: a
    one-off stall (lazy kernel loading on first use of a shape, another process) would
    otherwise make the device look slow and shrink every shape chosen from it.
    """
    if growth < 2:
        raise ValueError("growth must be ≥ 2")
    size = max(1, min(start, limit))
    seconds = run(size)
    while seconds < target_s and size * growth <= limit:
        size *= growth
        seconds = run(size)
    if confirm:
        seconds = min(seconds, run(size))
    return RateProbe(size=size, seconds=seconds, work=work(size))


def estimated_seconds(work: float, rates: Sequence[float]) -> float:
    """Seconds to do ``work`` once at each of ``rates`` in turn (device run + reference run)."""
    return sum(work / r for r in rates if r > 0)


def largest_fitting(
    cost_s: Callable[[int], float],
    budget_s: float,
    lo: int,
    hi: int,
    multiple: int = 1,
) -> int:
    """Largest multiple of ``multiple`` in [``lo``, ``hi``] whose ``cost_s`` fits ``budget_s``.

    ``cost_s`` must grow with size. When not even ``lo`` fits, ``lo`` is returned: a check
    still runs its smallest meaningful case rather than none (and reports the time it took).
    """
    if multiple < 1:
        raise ValueError("multiple must be ≥ 1")
    first = -(-lo // multiple)  # smallest multiple ≥ lo
    last = hi // multiple
    if last < first or cost_s(first * multiple) > budget_s:
        return lo
    while first < last:  # binary search for the last multiple that fits
        mid = (first + last + 1) // 2
        if cost_s(mid * multiple) <= budget_s:
            first = mid
        else:
            last = mid - 1
    return first * multiple
