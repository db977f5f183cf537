"""perf.serving's stability verdict end to end, against a server whose latencies are controlled.

The server (``tests/perf/latency_server.py``) is a real HTTP/SSE process on 127.0.0.1; the
check drives it through ``framework: endpoint`` exactly as it drives ``--endpoint``. Runs
are shaped from the server side (every other run 2× slower, +30 % over each run), so the
verdict is tested on latencies whose distribution is known. Host noise is tested twice:
with a scripted sampler (the run loop's bookkeeping, deterministic on any machine) and
with a real CPU-hog process, which is only told apart from the background on a machine
that is otherwise quiet (the test says so and skips where it is not).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.perf.hostnoise import HostReport, HostSampler
from adaptcheck.steps.frameworks.lifecycle import release
from adaptcheck.steps.perf import serving
from adaptcheck.steps.perf.serving import ServingCheck, ServingParams
from tests.perf.latency_server import latency_server
from tests.report.test_perf_report import view as page_view

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

SLOW = {"ttft_ms": 60.0, "itl_ms": 10.0}
"""Latencies large against this machine's scheduling noise (a few ms on a shared 2-core CPU)."""
QUIET_HOST = {"max_other_cores": 1000.0}
"""Host noise not judged: for the tests about the server's own behaviour on a shared machine."""
BASE: dict[str, Any] = {"framework": "endpoint", "levels": [2], "input_tokens": 16, "output_tokens": 12,
                        "num_requests": 16, "warmup_requests": 0, "host": QUIET_HOST}


def check(tmp_path: Path, url: str, **params: Any) -> Outcome:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=tmp_path, model=ModelSpec(),
                       check_id="perf.serving.t", endpoint={"url": url, "model": None, "reference": False})
    try:
        return ServingCheck().run(ctx, ServingParams(**{"scenario": "t", **BASE, **params}))
    finally:
        release(ctx)


def stability(outcome: Outcome, level: int = 0) -> dict[str, Any]:
    st: dict[str, Any] = outcome.details["levels"][level]["stability"]
    return st


def test_a_stable_server_passes_with_its_intervals_recorded(tmp_path: Path) -> None:
    with latency_server(**SLOW, jitter=0.02) as (url, _):
        outcome = check(tmp_path, url, scenario="steady", num_requests=12, max_cv=0.25, min_runs=3, max_runs=4)
    assert outcome.status == Status.PASS, outcome.message
    st = stability(outcome)
    assert st["verdict"] in ("stable", "undecided") and 3 <= st["runs"] <= 4 and st["disturbed_runs"] == 0
    assert st["decided"] == (st["verdict"] == "stable")
    assert set(st["metrics"]) == {"ttft_ms_median", "tpot_ms_median", "output_tok_per_s"}
    for m in st["metrics"].values():
        assert m["lo"] <= m["cv"] <= m["hi"] and m["n"] == st["runs"] == len(m["values"]) and m["cv"] < 0.25
    lv = outcome.details["levels"][0]
    assert all(not d["significant"] for d in lv["drift"].values() if d is not None)
    assert lv["drift"]["tpot_ms"] is not None and abs(lv["drift"]["tpot_ms"]["drift"]) < 0.2
    assert len(lv["runs"]) == st["runs"] and all(r["disturbed"] is None and "other_cores" in r["host"]
                                                   for r in lv["runs"])
    assert "run-to-run CV" in outcome.message and outcome.metrics["max_cv"] < 0.25
    lines = (tmp_path / outcome.details["records_file"]).read_text().splitlines()
    assert len(lines) == 12 * st["runs"]
    assert outcome.details["scenario"]["max_cv"] == 0.25 and outcome.details["scenario"]["min_runs"] == 3


def test_every_other_run_twice_as_slow_fails_naming_level_metric_and_interval(tmp_path: Path) -> None:
    with latency_server(**SLOW, period=16, scales=[1.0, 2.0]) as (url, control):
        outcome = check(tmp_path, url, scenario="flipflop", max_cv=0.15, min_runs=3, max_runs=8)
        served = control()["count"]
    assert outcome.status == Status.FAIL, outcome.message
    assert "flipflop: level 2: run-to-run CV of " in outcome.message and "> bound 15%" in outcome.message
    st = stability(outcome)
    # Runs 1x, 2x, 1x: significant at the first look; no run is wasted after that.
    assert st["verdict"] == "unstable" and st["stop"] == "unstable" and st["runs"] == 3 and served == 48
    worst = st["metrics"][st["worst"]]
    assert worst["lo"] > 0.15 and f"{worst['cv']:.0%} [{worst['lo']:.0%}, " in outcome.message
    tpot = st["metrics"]["tpot_ms_median"]["values"]
    assert tpot[1] > 1.6 * tpot[0] and tpot[1] > 1.6 * tpot[2]
    # The report shows the estimate with its interval, marks the significant cells, says the verdict.
    result = CheckResult(step=5, id="perf.serving.flipflop", kind="perf.serving", status=outcome.status,
                         message=outcome.message, details=outcome.details, duration_s=10.0)
    view = next(s for s in page_view([result]).serving if s.name == "flipflop")
    assert view.spread_bound == "15.0%"
    cells = {c.metric: c for c in view.levels[0].spread}
    tpot_m = st["metrics"]["tpot_ms_median"]
    assert cells["TPOT median"].over and cells["TPOT median"].value.startswith(f"{100 * tpot_m['cv']:.1f}% [")
    assert view.levels[0].stability == "significantly above the bound after 3 runs"
    assert view.levels[0].drift.startswith("TTFT ") and not view.levels[0].drift_over


def test_a_latency_drifting_thirty_percent_within_each_run_fails(tmp_path: Path) -> None:
    with latency_server(**SLOW, period=32, drift=0.3) as (url, _):
        outcome = check(tmp_path, url, scenario="drifting", num_requests=32, max_cv=0.25,
                        min_runs=3, max_runs=3, max_drift=0.2)
    assert outcome.status == Status.FAIL, outcome.message
    d = outcome.details["levels"][0]["drift"]["tpot_ms"]
    # The server slows each run's last request 30 % down; the client's own constant share of
    # TPOT dilutes that a little, so the measured drift is at most 30 %.
    assert d["significant"] and 0.2 < d["lo"] <= d["drift"] <= 0.31, d
    assert "level 2: TPOT drifts +" in outcome.message and "over a run > bound 20%" in outcome.message
    # The runs are alike (each drifts the same way): the run-to-run CV is not what failed.
    assert stability(outcome)["verdict"] != "unstable"


# ------------------------------------------------------------------------ host noise, scripted --

class ScriptedSampler:
    """Stands in for HostSampler: run k's report says what ``script[k]`` says (True: disturbed)."""

    script: ClassVar[list[bool]] = []
    calls: ClassVar[int] = 0

    def __init__(self, own_pids: Any, **_: Any) -> None:
        self.own = list(own_pids)

    def start(self) -> None:
        pass

    def stop(self) -> HostReport:
        k = ScriptedSampler.calls
        ScriptedSampler.calls += 1
        busy = ScriptedSampler.script[k] if k < len(ScriptedSampler.script) else False
        return HostReport(wall_s=1.0, samples=5, steal_fraction=0.0, other_cores=0.93 if busy else 0.02,
                          own_cores=0.5, mhz_min=None, mhz_max=None, cpus=2)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> type[ScriptedSampler]:
    ScriptedSampler.calls = 0
    monkeypatch.setattr(serving, "HostSampler", ScriptedSampler)
    return ScriptedSampler


def test_a_disturbed_run_is_kept_marked_left_out_and_repeated(tmp_path: Path,
                                                              scripted: type[ScriptedSampler]) -> None:
    scripted.script = [False, True, False, False]
    with latency_server(**SLOW, jitter=0.02) as (url, _):
        outcome = check(tmp_path, url, scenario="bumped", min_runs=3, max_runs=3, max_cv=0.25, host={})
    assert outcome.status == Status.PASS, outcome.message
    runs = outcome.details["levels"][0]["runs"]
    assert [r["disturbed"] for r in runs] == [None, "other processes used 0.93 cores (bound 0.30)", None, None]
    assert runs[1]["host"]["other_cores"] == 0.93
    st = stability(outcome)
    assert (st["runs"], st["disturbed_runs"]) == (3, 1) and all(m["n"] == 3 for m in st["metrics"].values())
    assert "3 runs (+1 disturbed, repeated)" in outcome.message and outcome.metrics["disturbed_runs"] == 1
    # The disturbed run's records stay in the records file.
    assert len((tmp_path / outcome.details["records_file"]).read_text().splitlines()) == 4 * 16


def test_a_host_that_stays_noisy_is_an_error_never_a_pass_or_a_fail(tmp_path: Path,
                                                                   scripted: type[ScriptedSampler]) -> None:
    scripted.script = [False, True, True, True]
    with latency_server(**SLOW, period=16, scales=[1.0, 2.0]) as (url, _):
        # Even a server that would fail (every other run 2x slower) is not judged on a noisy host.
        outcome = check(tmp_path, url, scenario="noisy", min_runs=3, max_runs=5, max_cv=0.15,
                        max_disturbed_runs=2, host={})
    assert outcome.status == Status.ERROR, outcome.message
    assert outcome.message.startswith("noisy: host too noisy to certify L4: level 2: 3 of 4 runs disturbed "
                                      "(other processes used 0.93-0.93 cores"), outcome.message
    assert "1 undisturbed run(s), 3 needed" in outcome.message and "stop other work" in outcome.message
    assert stability(outcome)["stop"] == "host_noise"


# ---------------------------------------------------------------- host speed, scripted probe --

class ScriptedProbe:
    """Stands in for HostSpeedProbe: the reference around run k is ``0.2 ms × scales[k]`` (cycled).

    perf.serving probes once before and once after every run, so call c belongs to run c // 2:
    the scripted host is slower exactly during the runs the latency server makes slower.
    """

    scales: ClassVar[list[float]] = [1.0]
    calls: ClassVar[int] = 0

    def __init__(self) -> None:
        self.unavailable: str | None = None
        self.cores = [0]

    def measure(self) -> float:
        k = ScriptedProbe.calls // 2
        ScriptedProbe.calls += 1
        return 0.2 * ScriptedProbe.scales[k % len(ScriptedProbe.scales)]


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> type[ScriptedProbe]:
    ScriptedProbe.calls = 0
    monkeypatch.setattr(serving, "HostSpeedProbe", ScriptedProbe)
    return ScriptedProbe


def test_runs_that_follow_the_hosts_speed_are_the_hosts_not_the_servers(tmp_path: Path,
                                                                         probe: type[ScriptedProbe]) -> None:
    # The same every-other-run-2x server that fails above, on a host whose reference is 2x slower in the
    # same runs (a busy hyper-thread sibling, another guest's memory traffic): not the server's instability.
    probe.scales = [1.0, 2.0]
    with latency_server(**SLOW, period=16, scales=[1.0, 2.0]) as (url, _):
        outcome = check(tmp_path, url, scenario="hostbound", max_cv=0.15, min_runs=3, max_runs=4)
    assert outcome.status == Status.PASS, outcome.message
    st = stability(outcome)
    tpot = st["metrics"]["tpot_ms_median"]
    assert tpot["lo"] > 0.15 and tpot["explained_by_host"] and tpot["verdict"] != "unstable"
    ha = tpot["host_adjusted"]
    assert ha["explained"] and ha["cv"] < 0.15 and 0.7 < ha["elasticity"] <= 1.1 and ha["speed_cv"] > 0.3
    # Explained: the loop did not stop for instability at the first significant look; it went on until the
    # host-adjusted intervals settled (stable) or the runs ran out.
    assert st["stop"] in ("stable", "max_runs") and st["verdict"] != "unstable" and 3 <= st["runs"] <= 4
    assert "the host's own speed explains level 2 run-to-run CV of " in outcome.message
    assert "host-adjusted (reference CV " in outcome.message
    runs = outcome.details["levels"][0]["runs"]
    assert [r["host"]["speed_ms"] for r in runs] == pytest.approx([0.2, 0.4, 0.2, 0.4][:len(runs)])
    assert runs[1]["host"]["speed_before_ms"] == runs[1]["host"]["speed_after_ms"] == pytest.approx(0.4)
    assert outcome.details["host_speed"]["elasticity"]["tpot_ms_median"] == pytest.approx(ha["elasticity"])
    # The report shows the measured interval and the host-adjusted figure, not marked as over the bound.
    result = CheckResult(step=5, id="perf.serving.hostbound", kind="perf.serving", status=outcome.status,
                         message=outcome.message, details=outcome.details, duration_s=10.0)
    view = next(s for s in page_view([result]).serving if s.name == "hostbound")
    cell = next(c for c in view.levels[0].spread if c.metric == "TPOT median")
    assert not cell.over and cell.value.endswith(f"; host-adjusted {100 * ha['cv']:.1f}%"), cell.value


def test_a_reference_that_does_not_follow_the_runs_leaves_the_failure(tmp_path: Path,
                                                                      probe: type[ScriptedProbe]) -> None:
    # The host slows in the wrong runs (1, 2 of every 4): the slope it finds cannot explain 2x jumps.
    probe.scales = [1.0, 1.05, 1.05, 1.0]
    with latency_server(**SLOW, period=16, scales=[1.0, 2.0]) as (url, _):
        outcome = check(tmp_path, url, scenario="flipflop", max_cv=0.15, min_runs=3, max_runs=4)
    assert outcome.status == Status.FAIL, outcome.message
    tpot = stability(outcome)["metrics"]["tpot_ms_median"]
    assert tpot["verdict"] == "unstable" and not tpot.get("explained_by_host")
    assert "host's own speed" not in outcome.message


# --------------------------------------------------------------------- host noise, a real hog --

def background_cores(seconds: float = 1.5) -> float:
    sampler = HostSampler([os.getpid()])
    sampler.start()
    time.sleep(seconds)
    report = sampler.stop()
    if report.other_cores is None:
        pytest.skip(f"host noise is not sampled here: {report.note}")
    return report.other_cores


def start_hog() -> int:
    """A busy loop in a process outside this test's process tree (double fork), as another job would be."""
    # The hog gets no pipe of ours: holding one open would keep this call waiting for its end.
    code = ("import subprocess, sys; d = subprocess.DEVNULL; p = subprocess.Popen([sys.executable, '-c', "
            "'while True: pass'], start_new_session=True, stdin=d, stdout=d, stderr=d); print(p.pid)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    return int(out.stdout)


def stop_hog(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def quiet_limit() -> float:
    """max_other_cores for the real-hog tests: above this machine's background, below a hog's core."""
    background = background_cores()
    if background > 0.5 or (os.cpu_count() or 1) < 2:
        pytest.skip(f"other processes already use {background:.2f} cores here: a CPU hog cannot be told "
                    "apart from them (run on a quiet machine with 2+ cores)")
    # A hog takes a whole core of the two; 0.45+ leaves a shared CI VM's background room to move.
    return max(0.45, background + 0.35)


# The real-hog tests judge other processes only: steal time on a shared CI VM (seen at 5.1 %
# there) is the hypervisor's, no hog's, and the steal bound has tests of its own.
STEAL_IGNORED = 1.0


@pytest.fixture
def hogs() -> Iterator[list[int]]:
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            stop_hog(pid)


def test_a_cpu_hog_during_one_run_marks_it_and_it_is_repeated(tmp_path: Path, quiet_limit: float,
                                                              hogs: list[int]) -> None:
    with latency_server(ttft_ms=40.0, itl_ms=10.0) as (url, control):

        def hog_in_first_run() -> None:
            # Requests 4-12 of the first run (each ~0.2 s): the hog lives well inside it.
            while control()["count"] < 4:
                time.sleep(0.02)
            hogs.append(start_hog())
            time.sleep(1.5)
            stop_hog(hogs[-1])

        thread = threading.Thread(target=hog_in_first_run, daemon=True)
        thread.start()
        # max_disturbed_runs and max_cv leave room for the background of a shared machine moving meanwhile.
        outcome = check(tmp_path, url, scenario="hogged", levels=[1], output_tokens=16, min_runs=3, max_runs=3,
                        max_cv=5.0, max_disturbed_runs=6,
                        host={"max_other_cores": quiet_limit, "max_steal_fraction": STEAL_IGNORED})
        thread.join(timeout=30)
    assert outcome.status == Status.PASS, outcome.message
    runs = outcome.details["levels"][0]["runs"]
    assert runs[0]["disturbed"] is not None and "other processes used" in runs[0]["disturbed"], runs[0]["host"]
    assert stability(outcome)["runs"] == 3 and len(runs) == 3 + stability(outcome)["disturbed_runs"]
    assert runs[-1]["disturbed"] is None


def test_a_cpu_hog_for_the_whole_check_is_host_too_noisy(tmp_path: Path, quiet_limit: float,
                                                         hogs: list[int]) -> None:
    hogs.append(start_hog())
    time.sleep(0.3)
    with latency_server(**SLOW) as (url, _):
        outcome = check(tmp_path, url, scenario="busy", levels=[1], num_requests=6, min_runs=2, max_runs=2,
                        max_disturbed_runs=1, host={"max_other_cores": quiet_limit,
                                                                  "max_steal_fraction": STEAL_IGNORED})
    assert outcome.status == Status.ERROR, outcome.message
    assert "host too noisy to certify L4: level 1: 2 of 2 runs disturbed" in outcome.message


# ------------------------------------------------------------------------------------ params --

@pytest.mark.parametrize(("old", "named"), [({"max_spread": 0.5}, "max_cv"), ({"repeats": 3}, "min_runs and max_runs")])
def test_the_old_spread_params_are_refused_naming_what_replaced_them(old: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as err:
        ServingParams(scenario="x", **old)
    text = str(err.value)
    assert f"was replaced by {named}" in text and "docs/perf.md" in text


def test_stability_params_are_checked() -> None:
    p = ServingParams(scenario="x")
    assert (p.min_runs, p.max_runs, p.max_cv, p.max_drift, p.max_disturbed_runs) == (3, 6, 0.15, 0.2, 3)
    assert p.host.limits().max_other_cores == 0.3
    with pytest.raises(ValidationError, match="max_runs"):
        ServingParams(scenario="x", min_runs=4, max_runs=3)
    with pytest.raises(ValidationError):
        ServingParams(scenario="x", min_runs=1)
    with pytest.raises(ValidationError):
        ServingParams(scenario="x", host={"max_other_core": 1})  # type: ignore[arg-type]

