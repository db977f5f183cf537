"""Host noise during a measurement: samples steal time, other processes' CPU and the clock on
a background thread around a run, and tells a disturbed host apart from an unstable server.
How it counts and what disturbs a run: docs/perf.md, "Run-to-run stability" ("Host noise").
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from adaptcheck.base.procs import descendants
from adaptcheck.base.schemas.serving_evidence import RunHost

MHZ_EVERY = 5
"""Read the clock every this many samples (/proc/cpuinfo is long on a many-core host)."""


@dataclass(frozen=True)
class HostLimits:
    """How much outside interference a measured run tolerates."""

    max_steal_fraction: float = 0.05
    """Steal time, as a share of the machine's CPU time over the window."""
    max_other_cores: float = 0.3
    """Cores used on average by processes outside the measured trees."""


@dataclass
class HostReport:
    """What the host did over one sampled window."""

    wall_s: float
    samples: int
    steal_fraction: float | None
    """Share of the machine's CPU time stolen by the hypervisor; None where /proc/stat has no steal column."""
    other_cores: float | None
    """Busy cores minus the measured trees' cores, averaged over the window (≥ 0)."""
    own_cores: float | None
    """Cores the measured trees used, averaged over the window."""
    mhz_min: float | None
    mhz_max: float | None
    """Lowest and highest mean CPU clock seen (MHz)."""
    note: str | None = None
    """Why figures are missing (not Linux, /proc unreadable), else None."""
    cpus: int | None = field(default=None)
    """CPUs the machine has (the scale for ``other_cores``)."""

    def disturbed(self, limits: HostLimits) -> str | None:
        """One line saying what disturbed the window beyond ``limits``, or None when it was quiet (or not judged)."""
        reasons: list[str] = []
        if self.steal_fraction is not None and self.steal_fraction > limits.max_steal_fraction:
            reasons.append(f"the hypervisor stole {100 * self.steal_fraction:.1f}% of the CPU time "
                           f"(bound {100 * limits.max_steal_fraction:.1f}%)")
        if self.other_cores is not None and self.other_cores > limits.max_other_cores:
            reasons.append(f"other processes used {self.other_cores:.2f} cores (bound {limits.max_other_cores:.2f})")
        return "; ".join(reasons) or None

    def evidence(self) -> RunHost:
        """The figures as a run's ``host`` record (rounded; ``note`` only when there is one)."""
        def r(v: float | None, nd: int = 4) -> float | None:
            return None if v is None else round(v, nd)

        out = RunHost(wall_s=r(self.wall_s, 3), samples=self.samples, cpus=self.cpus,
                      steal_fraction=r(self.steal_fraction), other_cores=r(self.other_cores, 3),
                      own_cores=r(self.own_cores, 3), mhz_min=r(self.mhz_min, 1), mhz_max=r(self.mhz_max, 1))
        if self.note:
            out.note = self.note
        return out


# ----------------------------------------------------------------------------- parsing --

@dataclass(frozen=True)
class CpuTimes:
    """The aggregate ``cpu`` line of /proc/stat, in clock ticks."""

    busy: int
    """user + nice + system (guest time is already inside user)."""
    total: int
    """user + nice + system + idle + iowait + irq + softirq + steal."""
    steal: int | None
    """None on kernels whose line has no steal column (before 2.6.11)."""


def parse_proc_stat(text: str) -> CpuTimes | None:
    """The aggregate ``cpu`` line of /proc/stat; None when there is none."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            vals = [int(v) for v in parts[1:]]
            if len(vals) < 4:
                return None
            steal = vals[7] if len(vals) >= 8 else None
            return CpuTimes(busy=sum(vals[:3]), total=sum(vals[:8]), steal=steal)
    return None


def count_cpus(text: str) -> int:
    """Number of ``cpuN`` lines in /proc/stat."""
    return sum(1 for line in text.splitlines() if line.startswith("cpu") and line[3:4].isdigit())


def parse_pid_stat(text: str) -> int | None:
    """``utime + stime + cutime + cstime`` (ticks) of a /proc/<pid>/stat line; None when malformed.

    The command name in parentheses may contain spaces and parentheses: fields are counted
    after the last ``)``.
    """
    rest = text[text.rfind(")") + 2:].split()
    # After ")": state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17) → indices 11..14.
    if len(rest) < 15:
        return None
    try:
        return sum(int(v) for v in rest[11:15])
    except ValueError:
        return None


def pid_state(text: str) -> str:
    """The one-letter state of a /proc/<pid>/stat line ("R", "S", "Z", …)."""
    return text[text.rfind(")") + 2:][:1]


def parse_cpuinfo_mhz(text: str) -> float | None:
    """Mean of the ``cpu MHz`` lines of /proc/cpuinfo; None when there are none."""
    vals: list[float] = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            try:
                vals.append(float(value))
            except ValueError:
                continue
    return sum(vals) / len(vals) if vals else None


def read_mhz() -> float | None:
    """Mean current clock over CPUs (MHz): cpufreq's scaling_cur_freq (kHz), else /proc/cpuinfo."""
    vals: list[float] = []
    for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            with open(path) as f:
                vals.append(int(f.read().strip()) / 1000.0)
        except (OSError, ValueError):
            continue
    if vals:
        return sum(vals) / len(vals)
    try:
        with open("/proc/cpuinfo") as f:
            return parse_cpuinfo_mhz(f.read())
    except OSError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


# ----------------------------------------------------------------------------- sampler --

class _TreeTicks:
    """Running CPU ticks of the measured process trees (see the module doc for the accounting)."""

    def __init__(self, roots: list[int]) -> None:
        self.roots = roots
        self.last: dict[int, int] = {}
        self.ticks = 0
        self.first = True

    def sample(self) -> None:
        pids: list[int] = []
        for root in self.roots:
            pids.append(root)
            pids.extend(descendants(root))
        now: dict[int, int] = {}
        for pid in dict.fromkeys(pids):
            text = _read(f"/proc/{pid}/stat")
            if text is None or pid_state(text) in ("Z", "X"):
                continue
            ticks = parse_pid_stat(text)
            if ticks is not None:
                now[pid] = ticks
        if not self.first:
            for pid, ticks in now.items():
                # Born in the window: all its time is in the window (fork starts at zero).
                self.ticks += ticks - self.last.get(pid, 0)
            for pid, ticks in self.last.items():
                if pid in now:
                    continue
                text = _read(f"/proc/{pid}/stat")
                if text is None or pid_state(text) in ("Z", "X"):
                    # Exited: its final total reappears in its parent's cutime when reaped.
                    self.ticks -= ticks
                # Else it left the tree alive (re-parented): keep what was counted.
        self.last = now
        self.first = False


class HostSampler:
    """Samples the host between :meth:`start` and :meth:`stop` on a background thread.

    ``own_pids`` are the roots whose whole process trees are the measurement (this
    process, the server); everything else busy on the machine is "other".
    """

    def __init__(self, own_pids: Iterable[int], *, interval_s: float = 0.2) -> None:
        self.own_pids = [int(p) for p in dict.fromkeys(own_pids)]
        self.interval_s = interval_s
        self._linux = sys.platform.startswith("linux") and os.path.isdir("/proc")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._tree = _TreeTicks(self.own_pids)
        self._cpu0: CpuTimes | None = None
        self._cpu1: CpuTimes | None = None
        self._cpus: int | None = None
        self._mhz: list[float] = []
        self._samples = 0
        self._t0 = 0.0
        self._t1 = 0.0
        self._error: str | None = None

    def start(self) -> None:
        """Take the first sample now and keep sampling in the background; never raises."""
        self._t0 = time.monotonic()
        if not self._linux:
            return
        try:
            self._sample(first=True)
            self._thread = threading.Thread(target=self._loop, name="adaptcheck-hostnoise", daemon=True)
            self._thread.start()
        except Exception as exc:  # noqa: BLE001 - sampling must never break a measurement
            self._error = f"host sampling failed: {type(exc).__name__}: {exc}"

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self._sample()
        except Exception as exc:  # noqa: BLE001 - see start
            self._error = f"host sampling failed: {type(exc).__name__}: {exc}"

    def _sample(self, *, first: bool = False) -> None:
        with self._lock:
            text = _read("/proc/stat")
            cpu = parse_proc_stat(text) if text else None
            if cpu is None:
                raise OSError("/proc/stat has no cpu line")
            self._tree.sample()
            if first:
                self._cpu0 = cpu
                self._cpus = count_cpus(text or "") or os.cpu_count()
            self._cpu1 = cpu
            self._t1 = time.monotonic()
            if self._samples % MHZ_EVERY == 0 or first:
                mhz = read_mhz()
                if mhz is not None:
                    self._mhz.append(mhz)
            self._samples += 1

    def stop(self) -> HostReport:
        """Stop sampling, take a last sample and summarise the window."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        wall = time.monotonic() - self._t0 if self._t0 else 0.0
        if not self._linux:
            return HostReport(wall, 0, None, None, None, None, None,
                              note=f"host noise not sampled: no /proc on {sys.platform}")
        if self._error is None:
            try:
                self._sample()
                mhz = read_mhz()
                if mhz is not None:
                    self._mhz.append(mhz)
            except Exception as exc:  # noqa: BLE001 - see start
                self._error = f"host sampling failed: {type(exc).__name__}: {exc}"
        if self._error is not None or self._cpu0 is None or self._cpu1 is None:
            return HostReport(wall, self._samples, None, None, None, None, None,
                              note=self._error or "host noise not sampled")
        return self._summary(self._cpu0, self._cpu1)

    def _summary(self, c0: CpuTimes, c1: CpuTimes) -> HostReport:
        hz = float(os.sysconf("SC_CLK_TCK"))
        span = self._t1 - self._t0
        d_total = c1.total - c0.total
        steal = None
        if c0.steal is not None and c1.steal is not None:
            steal = (c1.steal - c0.steal) / d_total if d_total > 0 else 0.0
        if span <= 0:
            busy = own = other = None
        else:
            busy = (c1.busy - c0.busy) / hz / span
            own = max(0.0, self._tree.ticks / hz / span)
            # Tick accounting differs between /proc/stat and per-process times by a tick or so.
            other = max(0.0, busy - own)
        return HostReport(wall_s=span, samples=self._samples, steal_fraction=steal, other_cores=other,
                          own_cores=own, mhz_min=min(self._mhz) if self._mhz else None,
                          mhz_max=max(self._mhz) if self._mhz else None, cpus=self._cpus)
