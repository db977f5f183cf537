"""smoke.device_visible, smoke.synchronize, smoke.streams_events."""

from __future__ import annotations

from pathlib import Path

from adaptcheck.ladder.check import NoParams
from adaptcheck.steps.smoke.device import (
    DeviceVisibleCheck,
    StreamsEventsCheck,
    StreamsEventsParams,
    SynchronizeCheck,
    SynchronizeParams,
)

from .helpers import (
    FAIL,
    PASS,
    SKIP,
    FakeStreamsBackend,
    MisplacedBackend,
    UnavailableBackend,
    ZeroTimerStreamsBackend,
    make_ctx,
)


def test_device_visible_on_cpu(tmp_path: Path) -> None:
    o = DeviceVisibleCheck().run(make_ctx(tmp_path), NoParams())
    assert o.status == PASS, o.message
    assert o.metrics["device_count"] == 1
    assert o.details["device_name"] and o.details["sum_of_2x_arange16"] == 240.0


def test_tensor_not_on_the_declared_device_fails(tmp_path: Path) -> None:
    o = DeviceVisibleCheck().run(make_ctx(tmp_path, MisplacedBackend()), NoParams())
    assert o.status == FAIL and "'xpu'" in o.message


def test_unavailable_backend_fails_with_reason(tmp_path: Path) -> None:
    o = DeviceVisibleCheck().run(make_ctx(tmp_path, UnavailableBackend()), NoParams())
    assert o.status == FAIL and "driver not loaded" in o.message


def test_missing_device_index_fails(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    ctx.device_index = 3
    o = DeviceVisibleCheck().run(ctx, NoParams())
    assert o.status == FAIL and "index 3" in o.message


def test_synchronize_completes_and_times(tmp_path: Path) -> None:
    o = SynchronizeCheck().run(make_ctx(tmp_path), SynchronizeParams(elements=4096, iterations=10))
    assert o.status == PASS, o.message
    assert o.metrics["total_s"] > 0
    assert o.details["host_mismatches"] == 0 and o.details["device_mismatches"] == 0


def test_streams_skip_as_not_applicable_on_cpu(tmp_path: Path) -> None:
    o = StreamsEventsCheck().run(make_ctx(tmp_path), StreamsEventsParams())
    assert o.status == SKIP and o.applicable is False


def test_streams_path_runs_against_a_streams_api(tmp_path: Path) -> None:
    o = StreamsEventsCheck().run(make_ctx(tmp_path, FakeStreamsBackend()), StreamsEventsParams(elements=4096, iterations=4))
    assert o.status == PASS, o.message
    assert o.metrics["elapsed_ms"] > 0 and o.metrics["mismatches"] == 0


def test_zero_event_time_fails(tmp_path: Path) -> None:
    o = StreamsEventsCheck().run(make_ctx(tmp_path, ZeroTimerStreamsBackend()), StreamsEventsParams(elements=64, iterations=2))
    assert o.status == FAIL and "elapsed_time" in o.message
