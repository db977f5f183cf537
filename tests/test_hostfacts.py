"""Host telemetry readers on recorded /proc and /sys contents."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptcheck.base import hostfacts as T


def test_process_memory(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t4\n")
    assert T.process_memory_kib(status) == {"VmHWM": 204800.0, "VmRSS": 102400.0}
    assert T.process_memory_kib(tmp_path / "missing") == {}


def test_cpu_utilisation_from_two_proc_stat_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n")

    def advance(_: float) -> None:  # the interval passes: 50 busy and 50 idle jiffies more
        stat.write_text("cpu  130 0 120 840 10 0 0 0 0 0\n")

    monkeypatch.setattr(T.time, "sleep", advance)
    assert T.cpu_utilisation_pct(0.1, stat) == 50.0
    assert T.cpu_utilisation_pct(0.1, tmp_path / "missing") is None


def test_cpu_frequency(tmp_path: Path) -> None:
    sysfs = tmp_path / "scaling_cur_freq"
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu MHz\t\t: 2000.0\n\nprocessor\t: 1\ncpu MHz\t\t: 3000.0\n")
    assert T.cpu_frequency_mhz(sysfs, cpuinfo) == 2500.0        # no cpufreq in this container
    sysfs.write_text("3100000\n")
    assert T.cpu_frequency_mhz(sysfs, cpuinfo) == 3100.0
    assert T.cpu_frequency_mhz(tmp_path / "x", tmp_path / "y") is None


def test_host_sample_on_this_machine() -> None:
    sample = T.host_sample(0.05)
    assert sample["process_rss_mib"] > 0 and sample["process_peak_rss_mib"] >= sample["process_rss_mib"]
    assert 0 <= sample["cpu_utilization_pct"] <= 100


def test_cpu_flags_reads_the_first_cpus_flags_on_x86_and_arm(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert T.cpu_flags(x86) == frozenset({"fpu", "sse2", "avx2", "fma"})
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve\n")
    assert T.cpu_flags(arm) == frozenset({"fp", "asimd", "sve"})
    assert T.cpu_flags(tmp_path / "missing") is None
    (tmp_path / "none").write_text("processor\t: 0\n")
    assert T.cpu_flags(tmp_path / "none") is None
