"""The arrival patterns of step 5's load (``burst``, ``concurrency``, ``poisson``): one string
enum, spelled as ladders and results spell it, that the load generator, the checks and the
report ask what a pattern is and how its level reads (docs/perf.md, module table and "The load
generator").
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class _Facts:
    """What one pattern is, and how its level reads. Templates take the level as the caller
    formats it (``{}``): the report and the checks each format numbers their own way."""

    open_loop: bool
    """Requests are sent on a clock, whatever the server does: the level is a rate (req/s, any
    positive number), a run's median TTFT is mostly queueing, and a server slower than the
    rate falls behind for the whole run."""
    one_wave: bool
    """Every request of a run is sent at once: the level is their number, a run has no
    duration and no steady state."""
    help: str
    """What a level is, for the params' descriptions."""
    level_word: str
    """The level column's header."""
    level_axis: str
    """A chart's level axis."""
    text: str
    """A level in a table ('2.5 req/s')."""
    legend: str
    """A level in a chart legend ('c=4')."""
    load: str
    """The load a soak at this level puts on the server."""


class Arrival(str, Enum):
    """How a run's requests are sent (the value is the ladder's and the results' spelling)."""

    BURST = "burst"
    CONCURRENCY = "concurrency"
    POISSON = "poisson"

    # Text is the name as the ladder spells it ('at poisson 2', 'concurrency levels …'), on
    # every Python: a str-mixin Enum formats as 'Arrival.POISSON' from 3.12 on (enum.StrEnum,
    # which does this, is 3.11+ and the package supports 3.10).
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def parse(cls, value: object) -> Arrival | None:
        """The pattern a results file names, or None for a missing or unknown one (results are
        read defensively: an older or edited file may hold anything)."""
        try:
            return cls(value) if isinstance(value, str) else None
        except ValueError:
            return None

    @property
    def _facts(self) -> _Facts:
        return _FACTS[self]

    @property
    def open_loop(self) -> bool:
        """Sent on a clock at ``level`` req/s whatever the server does (see :attr:`_Facts.open_loop`)."""
        return self._facts.open_loop

    @property
    def one_wave(self) -> bool:
        """All ``level`` requests sent at once (see :attr:`_Facts.one_wave`)."""
        return self._facts.one_wave

    @property
    def closed_loop(self) -> bool:
        """``level`` requests kept in flight, the next sent as one finishes."""
        return not (self.open_loop or self.one_wave)

    @property
    def timed(self) -> bool:
        """A run of this pattern can last a duration (every pattern but a one-wave burst)."""
        return not self.one_wave

    @property
    def help(self) -> str:
        return self._facts.help

    @property
    def level_word(self) -> str:
        return self._facts.level_word

    @property
    def level_axis(self) -> str:
        return self._facts.level_axis

    def level_text(self, level: str) -> str:
        """``level`` (already formatted) as a table shows it: '4', '2.5 req/s'."""
        return self._facts.text.format(level)

    def legend(self, level: str) -> str:
        """``level`` (already formatted) as a chart legend names it: 'c=4', '2.5 req/s', 'burst 32'."""
        return self._facts.legend.format(level)

    def load_text(self, level: str) -> str:
        """The load of a soak at ``level`` (already formatted): '2 requests in flight'."""
        return self._facts.load.format(level)

    def send_times(self, level: float, seed: int, *, count: int | None = None,
                   until_s: float | None = None) -> list[float]:
        """An open loop's send times (s from the window's start) at ``level`` req/s, drawn from
        ``seed`` only (every repeat replays the same times): ``count`` of them, or those before
        ``until_s``."""
        if self is Arrival.POISSON:
            return poisson_arrivals(level, seed, count=count, until_s=until_s)
        raise ValueError(f"{self.value} is not an open loop: its requests have no send times of their own")


_FACTS: dict[Arrival, _Facts] = {
    Arrival.BURST: _Facts(open_loop=False, one_wave=True, help="each level is a number of requests sent at once",
                          level_word="burst size", level_axis="requests per burst", text="{}", legend="burst {}",
                          load="{} requests sent at once"),
    Arrival.CONCURRENCY: _Facts(open_loop=False, one_wave=False,
                                help="each level is a number of requests kept in flight",
                                level_word="concurrency", level_axis="concurrency (requests in flight)", text="{}",
                                legend="c={}", load="{} requests in flight"),
    Arrival.POISSON: _Facts(open_loop=True, one_wave=False, help="each level is a rate (req/s)",
                            level_word="rate (req/s)", level_axis="offered rate (req/s)", text="{} req/s",
                            legend="{} req/s", load="{} req/s (Poisson arrivals)"),
}
# Checked at import, not left to a KeyError on first use: a member without its facts is a
# pattern half added.
if set(_FACTS) != set(Arrival):
    raise RuntimeError(f"arrival patterns without facts: {sorted(set(Arrival) - set(_FACTS))}")

TIMED: tuple[Arrival, ...] = tuple(a for a in Arrival if a.timed)
"""The patterns a run of a given duration can use (a soak's)."""


def describe(arrivals: tuple[Arrival, ...] | None = None) -> str:
    """'burst: each level is …; concurrency: …' for a params field's description."""
    return "; ".join(f"{a.value}: {a.help}" for a in (arrivals if arrivals is not None else tuple(Arrival))) + "."


def poisson_arrivals(rate: float, seed: int, *, count: int | None = None, until_s: float | None = None) -> list[float]:
    """Send times (s from the window's start) of a Poisson process: first at 0, exponential gaps."""
    if count is None and until_s is None:
        raise ValueError("give count or until_s")
    rng = random.Random(seed)
    times: list[float] = []
    t = 0.0
    while (count is None or len(times) < count) and (until_s is None or t < until_s):
        times.append(t)
        t += rng.expovariate(rate)
    return times
