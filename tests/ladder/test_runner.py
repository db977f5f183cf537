"""The runner survives the hardware: real crashing, hanging and raising checks in a worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaptcheck.base.schemas.ladder import CheckSpec, ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.runner import JournalWriter, PlannedRun, execute
from tests.conftest import popen_interruptible, run_cli

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")


def _init(run_dir: Path) -> dict[str, object]:
    return {"backend": "cpu", "device_index": 0, "seed": 1, "run_dir": str(run_dir),
            "model": ModelSpec().model_dump(mode="json"), "device_count": 1}


def _plan(*items: tuple[str, str, dict[str, object], float]) -> list[PlannedRun]:
    return [PlannedRun(CheckSpec(id=i, step=2, kind=k, params=p), t) for i, k, p, t in items]


def _execute(tmp_path: Path, plan: list[PlannedRun]) -> dict[str, list]:
    return execute(plan, _init(tmp_path), JournalWriter(tmp_path / "checks.jsonl"), tmp_path / "worker.log")


@pytest.mark.parametrize(("how", "signame"), [("segfault", "SIGSEGV"), ("abort", "SIGABRT"), ("kill", "SIGKILL"),
                                               ("exit", "exit code 7")])
def test_crashing_check_is_an_error_and_the_run_goes_on(tmp_path: Path, how: str, signame: str) -> None:
    done = _execute(tmp_path, _plan(("before", "dummy.pass", {}, 60), ("boom", "dummy.crash", {"how": how}, 60),
                                    ("after", "dummy.pass", {}, 60)))
    boom = done["boom"][0]
    assert boom.status is Status.ERROR
    assert signame in boom.message
    assert "about to crash" in boom.message  # the last line the check printed is kept as evidence
    assert done["before"][0].status is Status.PASS and done["after"][0].status is Status.PASS
    # The check after the crash ran in a fresh worker process.
    assert done["before"][0].metrics["pid"] != done["after"][0].metrics["pid"]


def test_hanging_check_is_killed_at_its_limit(tmp_path: Path) -> None:
    start = time.monotonic()
    done = _execute(tmp_path, _plan(("stuck", "dummy.hang", {}, 2.0), ("after", "dummy.pass", {}, 60)))
    elapsed = time.monotonic() - start
    assert done["stuck"][0].status is Status.ERROR
    assert "time limit of 2 s" in done["stuck"][0].message
    assert done["after"][0].status is Status.PASS
    assert elapsed < 60  # killed near its limit, not left to run


def test_python_exception_is_an_error_with_traceback_and_worker_survives(tmp_path: Path) -> None:
    done = _execute(tmp_path, _plan(("a", "dummy.pass", {}, 60), ("bad", "dummy.raise", {}, 60),
                                    ("b", "dummy.pass", {}, 60)))
    bad = done["bad"][0]
    assert bad.status is Status.ERROR
    assert "ValueError: raised on purpose" in bad.message
    assert "Traceback" in bad.details["traceback"]
    # An exception does not cost a worker restart.
    assert done["a"][0].metrics["pid"] == done["b"][0].metrics["pid"]


def test_failing_check_is_recorded_as_fail_not_error(tmp_path: Path) -> None:
    done = _execute(tmp_path, _plan(("f", "dummy.fail", {}, 60)))
    assert done["f"][0].status is Status.FAIL


def test_journal_is_appended_per_check_and_ignores_torn_line(tmp_path: Path) -> None:
    _execute(tmp_path, _plan(("a", "dummy.pass", {}, 60), ("b", "dummy.fail", {}, 60)))
    journal = tmp_path / "checks.jsonl"
    lines = journal.read_text().splitlines()
    assert [json.loads(ln)["spec_id"] for ln in lines] == ["a", "b"]
    with open(journal, "a") as fh:
        fh.write('{"spec_id": "c", "results": [')  # what a SIGKILL mid-write leaves
    assert set(JournalWriter(journal).read()) == {"a", "b"}


def _pids_of_workers(run_dir: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "adaptcheck.ladder.worker"], capture_output=True, text=True)
    pids = []
    for pid in out.stdout.split():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if str(run_dir).encode() in env:
            pids.append(int(pid))
    return pids


def test_sigkill_then_resume_keeps_finished_checks(tmp_path: Path, write_ladder) -> None:
    ladder = write_ladder([
        {"id": "first", "step": 1, "kind": "dummy.pass"},
        {"id": "slow", "step": 2, "kind": "dummy.sleep", "params": {"seconds": 300, "marker": "slow.started"}},
        {"id": "last", "step": 2, "kind": "dummy.pass"},
    ])
    run_dir = tmp_path / "run"
    env = dict(os.environ, ADAPTCHECK_TEST_RUN_DIR=str(run_dir))
    proc = subprocess.Popen([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(ladder), "--device", "cpu",
                             "--out", str(run_dir), "--quiet"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (run_dir / "slow.started").exists():
        assert proc.poll() is None, "run ended before the slow check started"
        assert time.monotonic() < deadline, "slow check never started"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    journal = JournalWriter(run_dir / "checks.jsonl").read()
    assert set(journal) == {"first"}
    assert not (run_dir / "results.json").exists()
    # The orphaned worker notices its runner is gone and exits by itself.
    deadline = time.monotonic() + 15
    while _pids_of_workers(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _pids_of_workers(run_dir) == []

    done = run_cli(["run", "--resume", str(run_dir), "--format", "json"], env={"ADAPTCHECK_TEST_RUN_DIR": str(run_dir)})
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert [c["id"] for c in results["checks"]] == ["first", "slow", "last"]
    assert all(c["status"] == "pass" for c in results["checks"])
    assert results["complete"] is True
    # 'first' ran exactly once: it was not repeated by the resume.
    assert (run_dir / "ran.txt").read_text().count("\n") == 2  # first + last
    assert (run_dir / "results.json").exists() and (run_dir / "report.html").exists()


def test_ctrl_c_writes_incomplete_results_and_exits_130(tmp_path: Path, write_ladder) -> None:
    ladder = write_ladder([
        {"id": "first", "step": 1, "kind": "dummy.pass"},
        {"id": "slow", "step": 2, "kind": "dummy.sleep", "params": {"seconds": 300, "marker": "slow.started"}},
    ])
    run_dir = tmp_path / "run"
    proc = popen_interruptible([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(ladder), "--device", "cpu",
                                "--out", str(run_dir), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (run_dir / "slow.started").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted" in err and "--resume" in err
    results = json.loads((run_dir / "results.json").read_text())
    assert results["complete"] is False and results["finished_at"] is None
    assert [c["id"] for c in results["checks"]] == ["first"]
    assert (run_dir / "report.html").exists()


def test_a_journal_from_before_kind_labels_is_read_with_the_kinds_labels(tmp_path: Path) -> None:
    # A run started before results 1.4 and resumed after the upgrade: its journal lines carry no
    # kind label (results.json's upgrade never sees them), so reading fills them from the kind.
    journal = tmp_path / "checks.jsonl"
    old = {"id": "framework.vllm.concurrent", "step": 4, "kind": "framework.concurrent", "status": "pass"}
    gone = {"id": "x.y", "step": 4, "kind": "plugin.gone", "status": "pass"}
    journal.write_text(json.dumps({"spec_id": "c", "results": [old, gone]}) + "\n")
    concurrent, orphan = JournalWriter(journal).read()["c"]
    assert concurrent.kind_label == "alone vs batched" and concurrent.compares == "batched vs alone"
    assert orphan.kind_label is None and orphan.compares is None  # a plugin gone since: as written
