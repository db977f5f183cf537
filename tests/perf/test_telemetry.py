"""The background telemetry sampler, and the CUDA readings it takes from a recorded nvidia-smi.

The sampler watches real processes (a child that allocates memory on a schedule) and reads
the real ``/proc``. Where a device behaviour cannot happen on this machine — a vendor tool
that crashes now and then, or takes seconds — a backend subclass does exactly that one
thing; the CUDA readings come from the recorded A100 ``nvidia-smi -q -x`` (tests/recordings,
from influxdata/telegraf's testdata) behind a fake ``nvidia-smi`` on PATH.

Time is virtual (tests/virtual_clock.py) wherever the test is about the schedule: the sampler
takes the clock and its wait, the test lets time pass, and the stamps are exact multiples of
the interval. Two tests stay on real time: the growing child (its memory grows on the real
clock) and the hung tool (stop()'s cut-off is a real wait on a real thread).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.backends.cuda import CudaBackend
from adaptcheck.base.hostfacts import cpu_frequency_mhz
from adaptcheck.perf import telemetry
from adaptcheck.perf.telemetry import TelemetrySampler
from adaptcheck.perf.trend import fit_trend
from tests.backends.fakes import fake_bin, install_fake_tool
from tests.virtual_clock import VirtualClock

# Tests with real processes (a growing child, a fake vendor tool) or real waits are marked slow, outside
# the fast lane (-m "not slow"); the sampler's schedule on virtual time takes milliseconds and stays in it.
slow = pytest.mark.slow

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
    """The CPU backend whose vendor tool takes ``delay_s`` of virtual time per reading (a large,
    busy machine)."""

    def __init__(self, clock: VirtualClock, delay_s: float) -> None:
        self.clock = clock
        self.delay_s = delay_s

    def telemetry_sample(self, index: int = 0) -> dict[str, float]:
        self.clock.sleep(self.delay_s)
        return {"memory_used_mib": 1.0}


class HungBackend(CpuBackend):
    """The CPU backend whose vendor tool hangs (really: :meth:`stop`'s cut-off is real time) until
    ``release`` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def telemetry_sample(self, index: int = 0) -> dict[str, float]:
        self.entered.set()
        self.release.wait(30)
        return {"memory_used_mib": 1.0}


def virtual_sampler(interval_s: float, threads: int, **kwargs: Any) -> tuple[TelemetrySampler, VirtualClock]:
    """A sampler on a :class:`VirtualClock` for its ``threads`` sampling threads (host, and device
    with a backend): the test lets time pass with ``clock.run_for``."""
    clock = VirtualClock(threads)
    return TelemetrySampler(interval_s, clock=clock, wait=clock.wait, **kwargs), clock


def grid(interval_s: float, n: int, offset: float = 0.0) -> list[Any]:
    """The times k × interval_s + offset, k < n, to compare a series' t_s with (virtual time: exact)."""
    return [pytest.approx(k * interval_s + offset, abs=1e-9) for k in range(n)]


# A real child that grows its memory: the point is real RSS read from /proc on real time.
@slow
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
    sampler, clock = virtual_sampler(0.1, 2, backend=backend)
    sampler.start()
    clock.run_for(0.95)
    result = sampler.stop()
    assert backend.calls == 10  # it kept calling after the first crash, on time
    assert result.device is not None and len(result.device.t_s) == 5  # the readings that did not crash
    assert all(v is not None for v in result.device.fields["memory_used_mib"])
    errors = result.evidence().dump()["errors"]
    assert len(errors) == 1 and errors[0]["source"] == "device"
    assert errors[0]["error"] == "RuntimeError: smi crashed" and errors[0]["count"] == 5
    assert errors[0]["first_t_s"] == pytest.approx(0.1)
    assert result.host.t_s == grid(0.1, 10)  # the host thread never noticed


def test_a_slow_device_tool_does_not_delay_host_samples() -> None:
    clock = VirtualClock(2)
    sampler = TelemetrySampler(0.1, backend=SlowBackend(clock, 0.35), clock=clock, wait=clock.wait).start()
    clock.run_for(1.18)  # the device thread is between readings (1.15 to 1.2): stop finds nothing running
    result = sampler.stop()
    # Every 0.1 s, whatever the device thread is doing (a host reading queued behind the 0.35 s
    # device call would leave gaps of 0.35 s or more).
    assert result.host.t_s == grid(0.1, 12)
    # Device readings at 0, 0.4 and 0.8 (the slots a reading overran are skipped), each stamped at
    # the middle of its 0.35 s call.
    assert result.device is not None and result.device.t_s == grid(0.4, 3, offset=0.175)
    assert result.evidence().dump()["device_sample_s"] == {"median": 0.35, "max": 0.35}
    assert not any("still running" in n for n in result.notes)


@pytest.mark.parametrize(("cost_s", "starts"), [
    (0.03, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),  # readings cost 0.03 s: still due at multiples of 0.2 s
    (0.45, [0.0, 0.6, 1.2, 1.8]),             # a reading overruns two slots: they are skipped, not bunched
])
def test_samples_are_taken_on_a_fixed_grid(cost_s: float, starts: list[float]) -> None:
    # No drift: every reading starts at a multiple of 0.2 s from the start, whatever the readings
    # cost (a loop waiting 0.2 s after each reading would fall behind by their cost); a reading
    # that overruns its slot does not make the next ones come at once to catch up.
    clock = VirtualClock(2)
    sampler = TelemetrySampler(0.2, backend=SlowBackend(clock, cost_s), clock=clock, wait=clock.wait).start()
    clock.run_for(starts[-1] + cost_s + 0.05)  # the last reading has ended, the next is not due
    result = sampler.stop()
    assert result.device is not None
    assert result.device.t_s == [pytest.approx(t + cost_s / 2, abs=1e-9) for t in starts]
    assert result.host.t_s == grid(0.2, len(result.host.t_s)) and len(result.host.t_s) >= len(starts)


# Real time: a hung tool is a real thread, cut off by stop()'s real wait (shortened here).
@slow
def test_stop_does_not_wait_for_a_hung_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "STOP_WAIT_S", 0.3)
    backend = HungBackend()
    release = threading.Timer(10.0, backend.release.set)  # a stop() that waited for the tool ends anyway
    release.start()
    try:
        sampler = TelemetrySampler(0.1, backend=backend).start()
        assert backend.entered.wait(10)
        start = time.monotonic()
        result = sampler.stop()
        assert time.monotonic() - start < 0.1 + 0.3 + 0.5
    finally:
        backend.release.set()
        release.cancel()
    assert any("device reading was still running" in n for n in result.notes)
    assert result.device is not None and result.device.t_s == []


@slow
def test_a_server_that_is_gone_is_recorded_not_fatal() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    sampler, clock = virtual_sampler(0.1, 1, pid=child.pid)
    sampler.start()
    clock.run_for(0.35)
    result = sampler.stop()
    assert result.host.t_s == grid(0.1, 4)
    assert result.host.fields["server_rss_mib"] == [None] * 4
    errors = result.evidence().dump()["errors"]
    assert [e["count"] for e in errors if "server process is gone" in e["error"]] == [4]


# --- CUDA: clocks and ECC counters from the recorded nvidia-smi -q -x ----------------------------

@slow
def test_cuda_telemetry_carries_clocks_and_ecc_counters(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "nvidia-smi", RECORDING.read_text())
    sample = CudaBackend().telemetry_sample(0)
    # The recorded A100 (driver 535.54.03): <clocks>, <temperature>, <ecc_errors><volatile>.
    assert sample == {"memory_used_mib": 50.0, "temperature_c": 27.0, "power_w": 67.03,
                      "graphics_clock_mhz": 1275.0, "sm_clock_mhz": 1275.0, "memory_clock_mhz": 1593.0,
                      "memory_temperature_c": 44.0, "ecc_volatile_correctable": 0.0,
                      "ecc_volatile_uncorrectable": 0.0}


@slow
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


@slow
def test_cuda_ecc_not_reported_stays_absent(fake_bin: Path) -> None:
    # Derived from the recording: a GPU without ECC prints N/A in every counter.
    text = RECORDING.read_text()
    for tag in ("sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable"):
        text = text.replace(f"<{tag}>0</{tag}>", f"<{tag}>N/A</{tag}>")
    install_fake_tool(fake_bin, "nvidia-smi", text)
    sample = CudaBackend().telemetry_sample(0)
    assert "ecc_volatile_uncorrectable" not in sample and "ecc_volatile_correctable" not in sample
    assert sample["sm_clock_mhz"] == 1275.0


@slow
def test_the_sampler_takes_cuda_readings_through_the_backend(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "nvidia-smi", RECORDING.read_text())
    sampler, clock = virtual_sampler(0.2, 2, backend=CudaBackend())
    sampler.start()
    clock.run_for(0.7)  # the fake tool runs in real time, at no virtual cost: readings at 0, 0.2, 0.4, 0.6
    device = sampler.stop().device
    assert device is not None and device.t_s == grid(0.2, 4)
    assert set(device.fields) >= {"memory_used_mib", "sm_clock_mhz", "ecc_volatile_uncorrectable", "power_w"}
    assert device.fields["memory_clock_mhz"][0] == 1593.0
