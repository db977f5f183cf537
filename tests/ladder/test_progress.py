"""Progress inside a long check: worker -> result pipe -> runner -> on_progress, then the result."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.backends.registry import get_backend
from adaptcheck.base.schemas.ladder import CheckSpec, ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import PROGRESS_MIN_INTERVAL_S, CheckContext
from adaptcheck.ladder.runner import JournalWriter, PlannedRun, execute

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")


def _init(run_dir: Path) -> dict[str, object]:
    return {"backend": "cpu", "device_index": 0, "seed": 1, "run_dir": str(run_dir),
            "model": ModelSpec().model_dump(mode="json"), "device_count": 1}


def _run(tmp_path: Path, plan: list[PlannedRun]) -> tuple[dict[str, list[Any]], list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    done = execute(plan, _init(tmp_path), JournalWriter(tmp_path / "checks.jsonl"), tmp_path / "worker.log",
                   on_progress=lambda spec, p: seen.append((spec.id, p)))
    return done, seen


def test_runner_passes_progress_on_and_still_gets_the_result(tmp_path: Path) -> None:
    plan = [PlannedRun(CheckSpec(id="long", step=2, kind="dummy.progress",
                                 params={"steps": 4, "interval_s": 0.6, "timed_s": 2.5}), 60),
            PlannedRun(CheckSpec(id="after", step=2, kind="dummy.pass"), 60)]
    done, seen = _run(tmp_path, plan)
    assert done["long"][0].status is Status.PASS
    assert done["long"][0].metrics["steps"] == 4  # the final reply, not a progress line, became the result
    steps = [p for cid, p in seen if p["unit"] == "steps"]
    assert [p["done"] for p in steps] == [1, 2, 3, 4]
    assert all(p["total"] == 4 for p in steps)
    timed = [p for cid, p in seen if p["unit"] == "s"]
    assert timed and all(p["total"] == 2.5 and p["note"] == "timed" for p in timed)
    assert all(0 < p["done"] <= 2.5 + 1.5 for p in timed)
    # Every message belongs to the check that sent it; none leaks into the next check.
    assert {cid for cid, _ in seen} == {"long"}
    assert done["after"][0].status is Status.PASS
    # Progress is display only: the journal holds the results alone.
    assert "\"done\"" not in (tmp_path / "checks.jsonl").read_text()


def test_progress_does_not_extend_the_time_limit(tmp_path: Path) -> None:
    start = time.monotonic()
    plan = [PlannedRun(CheckSpec(id="slow", step=2, kind="dummy.progress",
                                 params={"steps": 30, "interval_s": 0.6}), 3.0)]
    done, seen = _run(tmp_path, plan)
    assert done["slow"][0].status is Status.ERROR
    assert "time limit of 3 s" in done["slow"][0].message
    assert seen  # it did report progress, and was still killed at its limit
    assert time.monotonic() - start < 30


def _ctx(tmp_path: Path, sink: Any) -> CheckContext:
    ctx = CheckContext(backend=get_backend("cpu"), device_index=0, seed=0, run_dir=tmp_path, model=ModelSpec())
    ctx.check_id = "c"
    ctx.progress_sink = sink
    return ctx


def test_progress_is_rate_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import adaptcheck.ladder.check as check_mod

    now = [0.0]  # a fake clock (quarter seconds are exact in binary), so the test cannot be flaky
    monkeypatch.setattr(check_mod.time, "monotonic", lambda: now[0])
    sent: list[tuple[float, dict[str, Any]]] = []
    ctx = _ctx(tmp_path, lambda m: sent.append((now[0], m)))
    for i in range(1, 13):  # called every 0.25 s for 3 s
        ctx.progress(i, 12, "calls")
        now[0] += 0.25
    assert PROGRESS_MIN_INTERVAL_S == 0.5
    assert [m["progress"]["done"] for _, m in sent] == [1, 3, 5, 7, 9, 11]
    assert sent[0][1] == {"id": "c", "progress": {"done": 1, "total": 12, "unit": "calls", "note": ""}}


def test_progress_outside_a_worker_is_a_no_op(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, None)
    before = threading.active_count()
    ctx.progress(1, 2, "s")
    with ctx.timed_progress(5.0):
        assert threading.active_count() == before  # no ticker thread without a sink


def test_a_failing_sink_never_breaks_the_check(tmp_path: Path) -> None:
    def broken(_: dict[str, Any]) -> None:
        raise BrokenPipeError

    ctx = _ctx(tmp_path, broken)
    ctx.progress(1, 2, "s")  # does not raise
    assert ctx.progress_sink is None
