"""Telemetry sampled in the background for as long as a load runs (``perf.soak``'s evidence): host
and device series on threads of their own, every reading guarded and time-stamped, never
stopping early. Design: docs/perf.md ("The telemetry sampler"); recorded shape: docs/perf.md
("Soak outcome", ``telemetry``).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from adaptcheck.base.errors import exception_line
from adaptcheck.base.hostfacts import cpu_frequency_mhz, cpu_times
from adaptcheck.base.procs import tree_rss_mib
from adaptcheck.base.schemas.serving_evidence import SampleTiming, SoakTelemetry, TelemetryError

if TYPE_CHECKING:
    from typing_extensions import Self

    from adaptcheck.backends.base import Backend

MAX_ERROR_KINDS = 10
"""Distinct error messages kept per source (each with its count)."""
STOP_WAIT_S = 2.0
"""How long :meth:`TelemetrySampler.stop` waits for a reading in progress (a hung vendor tool
is abandoned, its thread is a daemon)."""
DIGITS = 3
PROC_STAT = Path("/proc/stat")


@dataclass
class SeriesSet:
    """Samples of one source as aligned lists: ``t_s`` and one list per field (None: not read)."""

    t_s: list[float] = field(default_factory=list)
    fields: dict[str, list[float | None]] = field(default_factory=dict)
    call_s: list[float] = field(default_factory=list)
    """How long each sample took to read."""

    def add(self, t_s: float, values: dict[str, float | None], call_s: float) -> None:
        n = len(self.t_s)
        self.t_s.append(t_s)
        self.call_s.append(call_s)
        for key, value in values.items():
            # A field seen for the first time is back-filled so every list stays aligned with t_s.
            self.fields.setdefault(key, [None] * n).append(value)
        for column in self.fields.values():
            if len(column) == n:
                column.append(None)

    def to_dict(self) -> dict[str, list[float | None]]:
        out: dict[str, list[float | None]] = {"t_s": [round(t, 2) for t in self.t_s]}
        for key, column in self.fields.items():
            out[key] = [round(v, DIGITS) if v is not None else None for v in column]
        return out


@dataclass
class _ErrorKind:
    """One distinct error message of a source: how often, and when first."""

    error: str
    count: int
    first_t_s: float

    def record(self, source: str) -> TelemetryError:
        """The ``telemetry.errors[]`` entry."""
        return TelemetryError(source=source, error=self.error, count=self.count, first_t_s=self.first_t_s)


@dataclass
class _Errors:
    """Error messages of one source: count and first time, in the order first seen."""

    seen: dict[str, _ErrorKind] = field(default_factory=dict)
    dropped: int = 0

    def add(self, t_s: float, message: str) -> None:
        entry = self.seen.get(message)
        if entry is not None:
            entry.count += 1
        elif len(self.seen) < MAX_ERROR_KINDS:
            self.seen[message] = _ErrorKind(error=message, count=1, first_t_s=round(t_s, 2))
        else:
            self.dropped += 1


@dataclass
class Telemetry:
    """What a sampler collected: the host and device series, errors, and notes on what is missing."""

    interval_s: float
    host: SeriesSet
    device: SeriesSet | None
    errors: dict[str, _Errors]
    notes: list[str]

    def evidence(self) -> SoakTelemetry:
        """The compact record docs/perf.md fixes (``details.telemetry`` of ``perf.soak``)."""
        errors = [entry.record(source) for source, errs in self.errors.items() for entry in errs.seen.values()]
        dropped = sum(e.dropped for e in self.errors.values())
        notes = self.notes + ([f"{dropped} more error(s) of other kinds not kept"] if dropped else [])
        calls = self.device.call_s if self.device is not None else []
        return SoakTelemetry(
            interval_s=self.interval_s,
            host=self.host.to_dict(),
            device=self.device.to_dict() if self.device is not None else None,
            device_sample_s=(SampleTiming(median=round(statistics.median(calls), 3), max=round(max(calls), 3))
                             if calls else None),
            errors=errors,
            notes=notes,
        )


class TelemetrySampler:
    """Samples host and device telemetry every ``interval_s`` between :meth:`start` and :meth:`stop`.

    ``pid``: the server's process (its tree's RSS is sampled); None when the server does not
    run on this machine. ``backend``: whose :meth:`telemetry_sample` gives the device
    readings; None for none (a server on another host: this machine's device is not the one
    serving). Use as a context manager or call start/stop; :meth:`stop` returns the result.

    ``clock`` (the time readings are stamped with and the grid is laid on) and ``wait`` (how a
    sampling thread waits for its next slot: ``wait(stop_event, seconds)``, True once stop was
    set) are injectable so that tests drive virtual time instead of sleeping through real
    intervals (tests/virtual_clock.py); real callers leave the defaults, ``time.monotonic``
    and ``threading.Event.wait``. :meth:`stop`'s wait for a reading in progress stays on real
    time: a hung vendor tool is a real thread.
    """

    def __init__(self, interval_s: float, *, pid: int | None = None, backend: Backend | None = None,
                 device_index: int = 0, clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[threading.Event, float], bool] = threading.Event.wait) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self.pid = pid
        self.backend = backend
        self.device_index = device_index
        self._clock = clock
        self._wait = wait
        self._t0 = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._host = SeriesSet()
        self._device = SeriesSet() if backend is not None else None
        self._errors: dict[str, _Errors] = {"host": _Errors(), "device": _Errors()}
        self._cpu_prev: tuple[int, int] | None = None
        self._threads: list[threading.Thread] = []

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> Self:
        self._t0 = self._clock()
        self._cpu_prev = _cpu_times_or_none()
        self._threads = [threading.Thread(target=self._loop, args=("host", self._host_sample), daemon=True,
                                          name="adaptcheck-telemetry-host")]
        if self._device is not None:
            self._threads.append(threading.Thread(target=self._loop, args=("device", self._device_sample),
                                                  daemon=True, name="adaptcheck-telemetry-device"))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> Telemetry:
        """Stop sampling and return what was collected (a reading still running is abandoned)."""
        self._stop.set()
        notes: list[str] = []
        deadline = time.monotonic() + self.interval_s + STOP_WAIT_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                what = "device" if thread.name.endswith("device") else "host"
                notes.append(f"a {what} reading was still running when sampling stopped (left behind)")
        if self.pid is None:
            notes.append("server memory not sampled: the server's process is not on this machine (or not visible)")
        if self._device is None:
            notes.append("device telemetry not sampled: no device on this machine serves the endpoint")
        return self._collected(notes)

    def snapshot(self) -> Telemetry:
        """What has been collected so far, while sampling goes on (a copy: the sampler keeps appending)."""
        return self._collected([])

    def _collected(self, notes: list[str]) -> Telemetry:
        with self._lock:  # a reading (or an abandoned one) may still append: copy under the lock
            return Telemetry(interval_s=self.interval_s, host=_copy(self._host),
                             device=_copy(self._device) if self._device is not None else None,
                             errors={k: _Errors(dict(v.seen), v.dropped) for k, v in self._errors.items()},
                             notes=notes)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            self.stop()

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._t0

    # -- sampling ------------------------------------------------------------------------

    def _loop(self, source: str, take: Callable[[], None]) -> None:
        """Call ``take`` on a fixed grid of ``interval_s`` from the start; a late reading skips
        the slots it overran instead of bunching samples up."""
        due = self._t0
        while not self._stop.is_set():
            try:
                take()
            except Exception as exc:  # noqa: BLE001 - a sampler that dies would end the evidence silently
                self._error(source, exception_line(exc, 200))
            now = self._clock()
            due += self.interval_s
            while due <= now:
                due += self.interval_s
            if self._wait(self._stop, due - now):
                return

    def _error(self, source: str, message: str) -> None:
        with self._lock:
            self._errors[source].add(self.elapsed_s, message)

    def _read(self, source: str, name: str, reader: Callable[[], float | None]) -> float | None:
        try:
            return reader()
        except Exception as exc:  # noqa: BLE001 - one unreadable field must not cost the others
            self._error(source, f"{name}: {exception_line(exc, 200)}")
            return None

    def _host_sample(self) -> None:
        start = self._clock()
        values: dict[str, float | None] = {}
        if self.pid is not None:
            pid = self.pid
            values["server_rss_mib"] = rss = self._read("host", "server_rss_mib", lambda: tree_rss_mib(pid))
            if rss is None:
                self._error("host", "server_rss_mib: the server process is gone or unreadable")
        values["cpu_utilization_pct"] = self._read("host", "cpu_utilization_pct", self._cpu_utilisation)
        values["cpu_frequency_mhz"] = self._read("host", "cpu_frequency_mhz", cpu_frequency_mhz)
        end = self._clock()
        with self._lock:
            self._host.add(start - self._t0, values, end - start)

    def _cpu_utilisation(self) -> float | None:
        now = _cpu_times_or_none()
        prev, self._cpu_prev = self._cpu_prev, now
        if now is None or prev is None or now[1] <= prev[1]:
            return None
        return 100.0 * (now[0] - prev[0]) / (now[1] - prev[1])

    def _device_sample(self) -> None:
        assert self.backend is not None and self._device is not None
        start = self._clock()
        sample = self.backend.telemetry_sample(self.device_index)
        end = self._clock()
        if not sample:
            self._error("device", f"{self.backend.name} telemetry returned no reading for device {self.device_index}")
        # Stamped at the middle of the call: a reading that took 2 s describes neither end.
        with self._lock:
            self._device.add((start + end) / 2 - self._t0, dict(sample), end - start)


def _cpu_times_or_none() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs; None where /proc/stat is missing or unreadable."""
    try:
        return cpu_times(PROC_STAT)
    except ValueError:
        return None


def _copy(series: SeriesSet) -> SeriesSet:
    return SeriesSet(t_s=list(series.t_s), fields={k: list(v) for k, v in series.fields.items()},
                     call_s=list(series.call_s))
