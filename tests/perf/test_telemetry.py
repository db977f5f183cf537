"""The background telemetry sampler, and the CUDA readings it takes from a recorded nvidia-smi.

The sampler watches real processes (a child that allocates memory on a schedule) and reads
the real ``/proc``. Where a device behaviour cannot happen on this machine — a vendor tool
that crashes now and then, or takes seconds — a backend subclass does exactly that one
thing; the CUDA readings come from the recorded A100 ``nvidia-smi -q -x`` (tests/recordings,
from influxdata/telegraf's testdata) behind a fake ``nvidia-smi`` on PATH.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.backends.cuda import CudaBackend
from adaptcheck.base.hostfacts import cpu_frequency_mhz
from adaptcheck.perf.telemetry import STOP_WAIT_S, TelemetrySampler
from adaptcheck.perf.trend import fit_trend
from tests.backends.fakes import fake_bin, install_fake_tool

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

__all__ = ["fake_bin"]  # the fixture, used by name below

RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "nvidia-smi" / "a100-sxm4-80gb_mig_r535.xml"
GROWER = """
import sys, time
blocks = []
print("ready", flush=True)
for _ in range(30):
    block = bytearray(4 << 20)
    block[::4096] = b"\\x01" * len(range(0, len(block), 4096))
    blocks.append(block)
    time.sleep(0.05)
time.sleep(30)
"""


class FlakyBackend(CpuBackend):
    """The CPU backend whose vendor tool crashes on every second reading."""

    def __init__(self) -> None:
        self.calls = 0

    def telemetry_sample(self, index: int = 0) -> dict[str, float]:
        self.calls += 1
        if self.calls % 2 == 0:
            raise RuntimeError("smi crashed")
        return super().telemetry_sample(index)


class SlowBackend(CpuBackend):
    """The CPU backend whose vendor tool takes ``delay_s`` per reading (a large, busy machine)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def telemetry_sample(self, index: int = 0) -> dict[str, float]:
        time.sleep(self.delay_s)
        return {"memory_used_mib": 1.0}


def test_a_growing_process_is_sampled_and_its_trend_found() -> None:
    child = subprocess.Popen([sys.executable, "-c", GROWER], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sampler = TelemetrySampler(0.1, pid=child.pid).start()
        time.sleep(1.4)
        result = sampler.stop()
    finally:
        child.kill()
        child.wait()
    host = result.host
    assert len(host.t_s) >= 10 and host.t_s == sorted(host.t_s)
    rss = host.fields["server_rss_mib"]
    assert len(rss) == len(host.t_s) and all(v is not None for v in rss)
    fit = fit_trend(host.t_s, rss)
    # 4 MiB every 50 ms (plus the scheduling slack of a shared machine): strongly rising.
    assert fit is not None and fit.slope_mib_per_min > 1000 and (fit.r2 or 0) > 0.8
    util = [v for v in host.fields["cpu_utilization_pct"] if v is not None]
    assert util and all(0.0 <= v <= 100.0 for v in util)
    if cpu_frequency_mhz() is not None:  # readable here (cpu MHz in /proc/cpuinfo)
        assert all(v is not None and v > 0 for v in host.fields["cpu_frequency_mhz"])
    assert result.device is None and any("device telemetry not sampled" in n for n in result.notes)
    data = result.evidence().dump()
    assert set(data) == {"interval_s", "host", "device", "device_sample_s", "errors", "notes"}
    assert list(data["host"]) == ["t_s", "server_rss_mib", "cpu_utilization_pct", "cpu_frequency_mhz"]


def test_a_failing_device_reading_is_recorded_and_sampling_goes_on() -> None:
    backend = FlakyBackend()
    sampler = TelemetrySampler(0.1, backend=backend).start()
    time.sleep(1.0)
    result = sampler.stop()
    assert backend.calls >= 6  # it kept calling after the first crash
    assert result.device is not None and len(result.device.t_s) >= 3
    assert all(v is not None for v in result.device.fields["memory_used_mib"])
    errors = result.evidence().dump()["errors"]
    assert len(errors) == 1 and errors[0]["source"] == "device"
    assert errors[0]["error"] == "RuntimeError: smi crashed" and errors[0]["count"] >= 3
    assert len(result.host.t_s) >= 8  # the host thread never noticed


def test_a_slow_device_tool_does_not_delay_host_samples() -> None:
    sampler = TelemetrySampler(0.1, backend=SlowBackend(0.5)).start()
    time.sleep(1.3)
    result = sampler.stop()
    assert len(result.host.t_s) >= 10  # every 0.1 s, whatever the device thread is doing
    gaps = [b - a for a, b in zip(result.host.t_s, result.host.t_s[1:], strict=False)]
    assert max(gaps) < 0.45  # a reading stalled behind the 0.5 s device call would leave a gap ≥ 0.5 s
    assert result.device is not None and 2 <= len(result.device.t_s) <= 4
    # A reading is stamped at the middle of its call: the first starts at 0 and takes 0.5 s.
    assert result.device.t_s[0] == pytest.approx(0.25, abs=0.1)
    assert result.evidence().dump()["device_sample_s"]["max"] >= 0.5


def test_stop_does_not_wait_for_a_hung_tool() -> None:
    sampler = TelemetrySampler(0.1, backend=SlowBackend(30.0)).start()
    time.sleep(0.2)
    start = time.monotonic()
    result = sampler.stop()
    assert time.monotonic() - start < 0.1 + STOP_WAIT_S + 0.5
    assert any("device reading was still running" in n for n in result.notes)
    assert result.device is not None and result.device.t_s == []


def test_a_server_that_is_gone_is_recorded_not_fatal() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    sampler = TelemetrySampler(0.1, pid=child.pid).start()
    time.sleep(0.35)
    result = sampler.stop()
    assert result.host.fields["server_rss_mib"] and all(v is None for v in result.host.fields["server_rss_mib"])
    assert any("server process is gone" in e["error"] for e in result.evidence().dump()["errors"])


def test_samples_are_taken_on_a_fixed_grid() -> None:
    sampler = TelemetrySampler(0.2).start()
    time.sleep(1.05)
    times = sampler.stop().host.t_s
    # No drift: every sample is due at a multiple of 0.2 s from the start, whatever the
    # readings cost (a loop sleeping 0.2 s after each reading would fall behind by their cost).
    assert len(times) >= 4 and times == sorted(times)
    lateness = [t - 0.2 * round(t / 0.2) for t in times]
    assert statistics.median(lateness) < 0.05 and all(-1e-6 <= x < 0.1 for x in lateness)


# --- CUDA: clocks and ECC counters from the recorded nvidia-smi -q -x ----------------------------

def test_cuda_telemetry_carries_clocks_and_ecc_counters(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "nvidia-smi", RECORDING.read_text())
    sample = CudaBackend().telemetry_sample(0)
    # The recorded A100 (driver 535.54.03): <clocks>, <temperature>, <ecc_errors><volatile>.
    assert sample == {"memory_used_mib": 50.0, "temperature_c": 27.0, "power_w": 67.03,
                      "graphics_clock_mhz": 1275.0, "sm_clock_mhz": 1275.0, "memory_clock_mhz": 1593.0,
                      "memory_temperature_c": 44.0, "ecc_volatile_correctable": 0.0,
                      "ecc_volatile_uncorrectable": 0.0}


def test_cuda_ecc_counts_add_sram_and_dram(fake_bin: Path) -> None:
    # Derived from the recording: volatile SRAM uncorrectable 1, DRAM uncorrectable 3, DRAM correctable 7.
    text = RECORDING.read_text()
    volatile = text.index("<volatile>", text.index("<ecc_errors>"))
    head, tail = text[:volatile], text[volatile:]
    for tag, value in (("sram_uncorrectable", 1), ("dram_uncorrectable", 3), ("dram_correctable", 7)):
        tail = tail.replace(f"<{tag}>0</{tag}>", f"<{tag}>{value}</{tag}>", 1)
    install_fake_tool(fake_bin, "nvidia-smi", head + tail)
    sample = CudaBackend().telemetry_sample(0)
    assert sample["ecc_volatile_uncorrectable"] == 4.0 and sample["ecc_volatile_correctable"] == 7.0


def test_cuda_ecc_not_reported_stays_absent(fake_bin: Path) -> None:
    # Derived from the recording: a GPU without ECC prints N/A in every counter.
    text = RECORDING.read_text()
    for tag in ("sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable"):
        text = text.replace(f"<{tag}>0</{tag}>", f"<{tag}>N/A</{tag}>")
    install_fake_tool(fake_bin, "nvidia-smi", text)
    sample = CudaBackend().telemetry_sample(0)
    assert "ecc_volatile_uncorrectable" not in sample and "ecc_volatile_correctable" not in sample
    assert sample["sm_clock_mhz"] == 1275.0


def test_the_sampler_takes_cuda_readings_through_the_backend(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "nvidia-smi", RECORDING.read_text())
    sampler = TelemetrySampler(0.2, backend=CudaBackend()).start()
    time.sleep(0.7)
    device = sampler.stop().device
    assert device is not None and len(device.t_s) >= 2
    assert set(device.fields) >= {"memory_used_mib", "sm_clock_mhz", "ecc_volatile_uncorrectable", "power_w"}
    assert device.fields["memory_clock_mhz"][0] == 1593.0
