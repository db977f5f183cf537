"""Host noise sampler: parsing of recorded /proc text, and real processes told apart.

The live tests run on a shared, noisy machine, so they never compare one sampler's figure
with a fixed "≈ 0": two samplers run over the same window with different measured trees,
and the difference between them is what the busy process did (both see the same outside
noise).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from adaptcheck.perf import hostnoise
from adaptcheck.perf.hostnoise import (
    HostLimits,
    HostReport,
    HostSampler,
    parse_cpuinfo_mhz,
    parse_pid_stat,
    parse_proc_stat,
)

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

PROC_STAT = textwrap.dedent("""\
    cpu  2260104 1060 278409 1635559 81761 0 4047 9373 0 0
    cpu0 882855 579 119124 1110370 12385 0 1380 5190 0 0
    cpu1 1377249 481 159284 525188 69375 0 2667 4183 0 0
    intr 1 2 3
    ctxt 12345
    """)


def test_proc_stat_busy_total_and_steal() -> None:
    cpu = parse_proc_stat(PROC_STAT)
    assert cpu is not None
    assert cpu.busy == 2260104 + 1060 + 278409  # user + nice + system; irq/softirq left out
    assert cpu.total == 2260104 + 1060 + 278409 + 1635559 + 81761 + 0 + 4047 + 9373  # guest not added twice
    assert cpu.steal == 9373
    assert hostnoise.count_cpus(PROC_STAT) == 2


def test_old_kernel_without_steal_column_gives_none() -> None:
    cpu = parse_proc_stat("cpu  100 0 50 1000 7 0 3\n")
    assert cpu is not None and cpu.steal is None and cpu.busy == 150 and cpu.total == 1160
    assert parse_proc_stat("intr 1 2\n") is None


def test_pid_stat_with_spaces_and_parentheses_in_the_name() -> None:
    # utime 700, stime 50, cutime 30, cstime 20 → 800; the name would shift naive splitting.
    line = ("4242 (my (odd) proc) S 1 4242 4242 0 -1 4194560 3000 0 0 0 700 50 30 20 20 0 "
            "9 0 123456 1000000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n")
    assert parse_pid_stat(line) == 800
    assert hostnoise.pid_state(line) == "S"
    assert parse_pid_stat("4242 (x) S 1 2 3") is None


def test_cpuinfo_mhz_is_the_mean_over_cpus() -> None:
    text = "processor\t: 0\ncpu MHz\t\t: 2000.000\n\nprocessor\t: 1\ncpu MHz\t\t: 3000.500\n"
    assert parse_cpuinfo_mhz(text) == pytest.approx(2500.25)
    assert parse_cpuinfo_mhz("processor : 0\n") is None


def test_disturbed_names_what_and_the_bound() -> None:
    limits = HostLimits()
    quiet = HostReport(2.0, 10, 0.01, 0.1, 1.0, 2500.0, 2600.0)
    assert quiet.disturbed(limits) is None
    busy = HostReport(2.0, 10, 0.0, 0.93, 1.0, None, None)
    assert busy.disturbed(limits) == "other processes used 0.93 cores (bound 0.30)"
    stolen = HostReport(2.0, 10, 0.08, 0.5, 1.0, None, None)
    reason = stolen.disturbed(HostLimits(max_steal_fraction=0.05, max_other_cores=0.3))
    assert reason is not None and "stole 8.0%" in reason and "bound 5.0%" in reason and "0.50 cores" in reason
    # Unknown figures are not judged.
    assert HostReport(2.0, 0, None, None, None, None, None).disturbed(limits) is None


def test_off_linux_every_figure_is_none_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostnoise.sys, "platform", "darwin")
    sampler = HostSampler([os.getpid()])
    sampler.start()
    report = sampler.stop()
    assert (report.steal_fraction, report.other_cores, report.own_cores, report.mhz_min) == (None,) * 4
    assert report.disturbed(HostLimits(max_other_cores=0.0, max_steal_fraction=0.0)) is None
    assert "not sampled" in str(report.evidence().note)


BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def _detached_busy(seconds: float) -> int:
    """A busy loop that is NOT a descendant of this process (its parent shell exits at once)."""
    out = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 & echo $!',
                          BUSY.format(s=seconds)], capture_output=True, text=True, check=True, timeout=10)
    return int(out.stdout.strip())


@pytest.fixture
def stranger() -> Iterator[int]:
    """A sleeping process with no children: a sampler rooted at it owns (almost) nothing."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def detached_busy() -> Iterator[int]:
    pid = _detached_busy(8.0)
    yield pid
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def _window(samplers: list[HostSampler], seconds: float) -> list[HostReport]:
    for s in samplers:
        s.start()
    time.sleep(seconds)
    return [s.stop() for s in samplers]


@linux_only
def test_a_busy_process_outside_the_trees_is_other_cores(detached_busy: int) -> None:
    time.sleep(0.3)  # the interpreter has started and is spinning
    ours, with_busy = _window([HostSampler([os.getpid()], interval_s=0.1),
                               HostSampler([os.getpid(), detached_busy], interval_s=0.1)], 2.0)
    busy_cores = (with_busy.own_cores or 0) - (ours.own_cores or 0)
    # It got most of a core (2 shared cores: not always all of one) …
    assert busy_cores > 0.5, (ours, with_busy)
    # … and a sampler that does not own it counts it as other: ≈ 1 core more than the one that does.
    assert ours.other_cores is not None and with_busy.other_cores is not None
    assert ours.other_cores - with_busy.other_cores == pytest.approx(busy_cores, abs=0.15)
    assert ours.other_cores > 0.5
    assert ours.disturbed(HostLimits()) is not None
    assert ours.samples >= 10 and ours.steal_fraction is not None and ours.wall_s == pytest.approx(2.0, abs=0.5)


@linux_only
def test_our_own_busy_thread_is_own_not_other(stranger: int) -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    worker = threading.Thread(target=spin, daemon=True)
    worker.start()
    try:
        ours, other = _window([HostSampler([os.getpid()], interval_s=0.1),
                               HostSampler([stranger], interval_s=0.1)], 2.0)
    finally:
        stop.set()
        worker.join()
    assert ours.own_cores is not None and ours.own_cores > 0.5
    assert ours.other_cores is not None and other.other_cores is not None
    assert other.own_cores == pytest.approx(0.0, abs=0.05)
    # The sampler that does not own this process sees our spinning as "other"; ours does not.
    # Within a quarter core: the two samplers read /proc at slightly different instants, and on a
    # 2-core host the test's own interpreter competes with the spinner (0.80 vs 0.98 seen once).
    assert other.other_cores - ours.other_cores == pytest.approx(ours.own_cores, abs=0.25)


@linux_only
def test_short_lived_children_of_the_tree_count_as_own(stranger: int) -> None:
    # A child that itself runs 6 busy grandchildren of 0.25 s one after another: each
    # grandchild lives between samples or across one, and is reaped by its parent.
    script = ("import subprocess, sys\n"
              f"for _ in range(6): subprocess.run([sys.executable, '-c', {BUSY.format(s=0.25)!r}])\n")
    ours, others = (HostSampler([os.getpid()], interval_s=0.1), HostSampler([stranger], interval_s=0.1))
    ours.start()
    others.start()
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    a, b = ours.stop(), others.stop()
    assert a.own_cores is not None and b.other_cores is not None and a.other_cores is not None
    own_ticks_s = a.own_cores * a.wall_s
    assert own_ticks_s > 0.8, a  # ≥ ~1.5 s of busy grandchildren, minus contention on 2 shared cores
    # Counted once: the stranger's "other" exceeds ours by what our tree did, not twice that.
    assert (b.other_cores - a.other_cores) * a.wall_s == pytest.approx(own_ticks_s, abs=0.3)


def test_the_record_rounds_and_keeps_every_field() -> None:
    d = HostReport(1.23456, 7, 0.012345, 0.333333, 1.0, 2596.15, 2600.0, cpus=2).evidence().dump()
    assert d == {"wall_s": 1.235, "samples": 7, "cpus": 2, "steal_fraction": 0.0123, "other_cores": 0.333,
                 "own_cores": 1.0, "mhz_min": 2596.2, "mhz_max": 2600.0}


def test_steal_beyond_its_bound_disturbs_a_window_and_says_so() -> None:
    def window(steal: float | None, other: float) -> HostReport:
        return HostReport(wall_s=2.0, samples=10, steal_fraction=steal, other_cores=other, own_cores=1.0,
                          mhz_min=None, mhz_max=None, cpus=2)

    limits = HostLimits(max_steal_fraction=0.05, max_other_cores=0.3)
    assert window(0.049, 0.1).disturbed(limits) is None
    assert window(None, 0.1).disturbed(limits) is None  # no steal column: not judged on it
    assert window(0.051, 0.1).disturbed(limits) == "the hypervisor stole 5.1% of the CPU time (bound 5.0%)"
    both = window(0.2, 0.9).disturbed(limits)
    assert both is not None and "stole 20.0%" in both and "other processes used 0.90 cores (bound 0.30)" in both
