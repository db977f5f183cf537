"""Host-side facts read from /proc and /sys (Linux): monitoring figures for the telemetry
check, and /proc/cpuinfo's fields and ISA flags for the CPU backend, its peak and step 3.

They answer "can basic monitoring be read here?" for the host every backend runs on, and
are the device figures themselves on the CPU backend. Each reader returns None when its
source is missing (containers often hide /sys/.../cpufreq), never raises.
"""

from __future__ import annotations

import time
from pathlib import Path


def parse_lscpu_like(cpuinfo: str) -> dict[str, str]:
    """First processor block of /proc/cpuinfo as a dict (model name, flags, MHz …)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The ISA flags of the first CPU in /proc/cpuinfo ('avx2', 'avx512_vnni' …); None where unreadable."""
    try:
        fields = parse_lscpu_like(cpuinfo.read_text(errors="replace"))
    except OSError:
        return None
    # x86 says 'flags', arm64 says 'Features'.
    line = fields.get("flags", fields.get("Features"))
    return None if line is None else frozenset(line.split())


def process_memory_kib(status: Path = Path("/proc/self/status")) -> dict[str, float]:
    """Resident set size and its peak of this process, in KiB (VmRSS, VmHWM)."""
    out: dict[str, float] = {}
    try:
        for line in status.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM") and rest.split():
                out[key] = float(rest.split()[0])
    except (OSError, ValueError):
        pass
    return out


def cpu_times(stat: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from the first line of /proc/stat."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:] if v.isdigit()]
    if len(values) < 4:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    # guest/guest_nice (fields 9, 10) are already counted in user/nice.
    total = sum(values[:8])
    return total - idle, total


def cpu_utilisation_pct(interval_s: float = 0.25, stat: Path = Path("/proc/stat")) -> float | None:
    """Busy share of all CPUs over ``interval_s`` (two /proc/stat reads), in %."""
    first = cpu_times(stat)
    if first is None:
        return None
    time.sleep(interval_s)
    second = cpu_times(stat)
    if second is None:
        return None
    busy, total = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return None
    return round(100.0 * busy / total, 2)


def cpu_frequency_mhz(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq"),
                      cpuinfo: Path = Path("/proc/cpuinfo")) -> float | None:
    """Current frequency of CPU 0 from cpufreq, else the mean 'cpu MHz' of /proc/cpuinfo."""
    try:
        return round(float(sysfs.read_text().strip()) / 1000.0, 1)
    except (OSError, ValueError):
        pass
    try:
        mhz = [float(line.split(":", 1)[1]) for line in cpuinfo.read_text().splitlines()
               if line.startswith("cpu MHz")]
    except (OSError, ValueError, IndexError):
        return None
    return round(sum(mhz) / len(mhz), 1) if mhz else None


def host_sample(interval_s: float = 0.25) -> dict[str, float]:
    """Host figures that could be read: RSS, peak RSS, CPU utilisation, CPU frequency."""
    out: dict[str, float] = {}
    mem = process_memory_kib()
    if "VmRSS" in mem:
        out["process_rss_mib"] = round(mem["VmRSS"] / 1024.0, 2)
    if "VmHWM" in mem:
        out["process_peak_rss_mib"] = round(mem["VmHWM"] / 1024.0, 2)
    util = cpu_utilisation_pct(interval_s)
    if util is not None:
        out["cpu_utilization_pct"] = util
    freq = cpu_frequency_mhz()
    if freq is not None:
        out["cpu_frequency_mhz"] = freq
    return out
