"""Resume cannot lose or double work: folder lock, torn journal lines, the stored ladder's digest.

Each case was reproduced on main before the fix: a torn last line swallowed the resumed
record (complete:false, lower grade, exit 0); an edited ladder.yaml was used silently; a
second run or resume of a live folder ran the checks twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from adaptcheck.base.errors import UsageError
from adaptcheck.base.runlock import LOCK_FILE, acquire, read_holder
from adaptcheck.ladder.runner import JournalWriter
from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

CHEAP = [
    {"id": "first", "step": 1, "kind": "dummy.pass"},
    {"id": "second", "step": 2, "kind": "dummy.pass"},
    {"id": "third", "step": 2, "kind": "dummy.pass"},
]


def _ran(run_dir: Path) -> int:
    """How many dummy.pass checks executed in this folder (each appends a line to ran.txt)."""
    marker = run_dir / "ran.txt"
    return marker.read_text().count("\n") if marker.exists() else 0


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished run of the cheap ladder; tests copy it and damage the copy."""
    from tests.conftest import finished_run

    run_dir = finished_run(tmp_path_factory.mktemp("clean"), CHEAP)
    assert json.loads((run_dir / "results.json").read_text())["complete"] is True
    return run_dir


def _killed_copy(clean: Path, dest: Path, keep_lines: int, torn_tail: bool) -> Path:
    """The clean run as a SIGKILL would have left it: outputs not yet written, the journal cut
    after ``keep_lines`` records, optionally with half of the next record (no newline)."""
    shutil.copytree(clean, dest)
    for name in ("results.json", "report.html"):
        (dest / name).unlink()
    lines = (clean / "checks.jsonl").read_bytes().splitlines(keepends=True)
    body = b"".join(lines[:keep_lines])
    if torn_tail:
        body += lines[keep_lines][: len(lines[keep_lines]) // 2]
    (dest / "checks.jsonl").write_bytes(body)
    return dest


def _one_line_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "internal error" not in lines[0]
    return lines[0]


# --- torn journal -----------------------------------------------------------------------------

def test_torn_last_line_is_set_aside_and_its_check_runs_again(clean_run: Path, tmp_path: Path) -> None:
    run_dir = _killed_copy(clean_run, tmp_path / "run", keep_lines=1, torn_tail=True)
    fragment = (run_dir / "checks.jsonl").read_bytes().splitlines(keepends=True)[-1]
    ran_before = _ran(run_dir)

    done = run_cli(["run", "--resume", str(run_dir), "--format", "json"])
    assert done.returncode == 0, done.stderr

    results = json.loads((run_dir / "results.json").read_text())
    assert [c["id"] for c in results["checks"]] == ["first", "second", "third"]  # each exactly once
    assert results["complete"] is True
    clean = json.loads((clean_run / "results.json").read_text())
    assert results["grade"]["level"] == clean["grade"]["level"] == "L2"
    # Every journal line is a whole record again, one per check.
    ids = [json.loads(ln)["spec_id"] for ln in (run_dir / "checks.jsonl").read_text().splitlines()]
    assert ids == ["first", "second", "third"]
    # The torn record's check ran again, the finished one did not.
    assert _ran(run_dir) == ran_before + 2
    # The torn bytes are kept for a post-mortem.
    assert (run_dir / "checks.jsonl.torn").read_bytes() == fragment + b"\n"
    assert "set aside" in done.stderr and "checks.jsonl.torn" in done.stderr  # and the user is told


def test_repair_sets_aside_garbage_and_unterminated_lines(tmp_path: Path, clean_run: Path) -> None:
    good = (clean_run / "checks.jsonl").read_bytes().splitlines(keepends=True)
    journal = tmp_path / "checks.jsonl"
    # A valid record without its newline is still torn: the next append would glue onto it.
    journal.write_bytes(good[0] + b"not json\n" + good[1] + b"\n" + good[2].rstrip(b"\n"))
    writer = JournalWriter(journal)
    assert set(writer.read()) == {"first", "second"}

    repaired = writer.repair()
    assert repaired is not None and repaired.fragments == 3
    assert journal.read_bytes() == good[0] + good[1]
    assert (tmp_path / "checks.jsonl.torn").read_bytes() == b"not json\n\n" + good[2]
    assert writer.repair() is None  # a sound journal is left alone
    assert journal.read_bytes() == good[0] + good[1]


# --- stored ladder ----------------------------------------------------------------------------

def test_edited_ladder_is_refused_and_nothing_runs(clean_run: Path, tmp_path: Path) -> None:
    run_dir = _killed_copy(clean_run, tmp_path / "run", keep_lines=1, torn_tail=False)
    ladder = run_dir / "ladder.yaml"
    ladder.write_text(ladder.read_text().replace("dummy.pass", "dummy.fail", 1))
    journal_before = (run_dir / "checks.jsonl").read_bytes()
    ran_before = _ran(run_dir)

    done = run_cli(["run", "--resume", str(run_dir)])
    assert done.returncode == 5, done.stderr
    line = _one_line_error(done.stderr)
    assert "ladder.yaml" in line and "edited after the run started" in line
    assert _ran(run_dir) == ran_before
    assert (run_dir / "checks.jsonl").read_bytes() == journal_before
    assert not (run_dir / "results.json").exists()


def test_a_model_auto_that_now_means_another_model_is_refused(tmp_path: Path) -> None:
    """``auto`` resolves when each check runs: a pretrained package installed or removed between
    the kill and the resume would make the rest of the run certify another model."""
    from adaptcheck.frameworks.pretrained import auto_choice
    from tests.conftest import ladder_text

    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(ladder_text(CHEAP).replace("checks:", "model: {name: auto}\nchecks:", 1))
    clean = tmp_path / "clean"
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(clean), "--quiet"])
    assert done.returncode == 0, done.stderr
    meta = json.loads((clean / "run.json").read_text())
    assert meta["model"] is None and meta["model_auto"] == auto_choice()[0]  # pinned when the run started

    def killed(name: str, run_meta: dict[str, object]) -> Path:
        """The run as a kill after its first check left it, with this run.json."""
        run_dir = _killed_copy(clean, tmp_path / name, keep_lines=1, torn_tail=False)
        (run_dir / "run.json").write_text(json.dumps(run_meta))
        return run_dir

    run_dir = killed("other", {**meta, "model_auto": "pretrained:another-model"})
    ran_before, journal_before = _ran(run_dir), (run_dir / "checks.jsonl").read_bytes()
    done = run_cli(["run", "--resume", str(run_dir)])
    assert done.returncode == 5, done.stderr
    line = _one_line_error(done.stderr)
    assert "'auto' = pretrained:another-model" in line and auto_choice()[0] in line, line
    assert _ran(run_dir) == ran_before and (run_dir / "checks.jsonl").read_bytes() == journal_before

    # The same model as at the start: the resume goes on (a run.json without the field too).
    assert run_cli(["run", "--resume", str(killed("same", meta))]).returncode == 0
    old = killed("old", {k: v for k, v in meta.items() if k != "model_auto"})
    assert run_cli(["run", "--resume", str(old)]).returncode == 0


def test_missing_ladder_is_a_bad_folder(clean_run: Path, tmp_path: Path) -> None:
    run_dir = _killed_copy(clean_run, tmp_path / "run", keep_lines=1, torn_tail=False)
    (run_dir / "ladder.yaml").unlink()
    done = run_cli(["run", "--resume", str(run_dir)])
    assert done.returncode == 3, done.stderr
    assert "ladder.yaml" in _one_line_error(done.stderr)


def test_resumed_results_claim_the_ladder_that_ran(clean_run: Path, tmp_path: Path) -> None:
    run_dir = _killed_copy(clean_run, tmp_path / "run", keep_lines=2, torn_tail=False)
    done = run_cli(["run", "--resume", str(run_dir)])
    assert done.returncode == 0, done.stderr
    claimed = json.loads((run_dir / "results.json").read_text())["ladder"]["sha256"]
    assert claimed == hashlib.sha256((run_dir / "ladder.yaml").read_bytes()).hexdigest()
    assert claimed == json.loads((run_dir / "run.json").read_text())["ladder"]["sha256"]


def test_a_run_of_a_ladder_that_extends_another_stores_it_resolved(tmp_path: Path) -> None:
    """The run folder's ladder.yaml is the resolved ladder: a resume needs neither the child's
    file nor its parent's (both may have changed or gone since the run started)."""
    from adaptcheck.ladder.loader import load_ladder
    from tests.conftest import ladder_text

    parent = tmp_path / "site" / "base.yaml"
    parent.parent.mkdir()
    parent.write_text(ladder_text(CHEAP))
    child = tmp_path / "site" / "small.yaml"
    child.write_text("schema_version: 1\nextends: base.yaml\nid: small\nwithout: [third]\n"
                     "add:\n  - {id: extra, step: 2, kind: dummy.pass, after: first}\n")
    clean = tmp_path / "clean"
    done = run_cli(["run", "--ladder", str(child), "--device", "cpu", "--out", str(clean), "--quiet"])
    assert done.returncode == 0, done.stderr
    stored = (clean / "ladder.yaml").read_text(encoding="utf-8")
    assert stored == load_ladder(str(child)).text
    assert "extends" not in stored.split("\nschema_version:", 1)[1]  # only its header comment names the files
    meta = json.loads((clean / "run.json").read_text())
    assert meta["ladder"]["sha256"] == hashlib.sha256(stored.encode()).hexdigest()

    run_dir = _killed_copy(clean, tmp_path / "run", keep_lines=1, torn_tail=False)
    shutil.rmtree(tmp_path / "site")
    done = run_cli(["run", "--resume", str(run_dir), "--format", "json"])
    assert done.returncode == 0, done.stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert [c["id"] for c in results["checks"]] == ["first", "extra", "second"] and results["complete"]
    assert results["ladder"]["id"] == "small"


# --- the folder lock --------------------------------------------------------------------------

def test_lock_is_exclusive_names_its_holder_and_is_released(tmp_path: Path) -> None:
    lock = acquire(tmp_path, "adaptcheck run")
    with pytest.raises(UsageError) as refused:
        acquire(tmp_path, "adaptcheck run --resume")
    assert f"pid {os.getpid()}" in refused.value.one_line() and "adaptcheck run," in refused.value.one_line()
    # A refused process leaves the holder's description intact.
    holder = read_holder(tmp_path)
    assert holder is not None and holder.pid == os.getpid() and holder.command == "adaptcheck run"
    lock.release()
    acquire(tmp_path, "adaptcheck run --resume").release()


def _hold_lock_in_child(run_dir: Path) -> subprocess.Popen[str]:
    """A separate process that takes the folder's lock as a resume does and keeps it."""
    code = ("import sys; from pathlib import Path; from adaptcheck.base.runlock import acquire; "
            "lock = acquire(Path(sys.argv[1]), 'adaptcheck run --resume'); print('locked', flush=True); "
            "sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "locked"
    return child


def test_second_resume_is_refused_while_the_first_holds_the_folder(clean_run: Path, tmp_path: Path) -> None:
    run_dir = _killed_copy(clean_run, tmp_path / "run", keep_lines=1, torn_tail=False)
    holder = _hold_lock_in_child(run_dir)
    try:
        journal_before = (run_dir / "checks.jsonl").read_bytes()
        done = run_cli(["run", "--resume", str(run_dir)])
        assert done.returncode == 2, done.stderr
        line = _one_line_error(done.stderr)
        assert f"pid {holder.pid}" in line and "adaptcheck run --resume" in line and "since" in line
        assert (run_dir / "checks.jsonl").read_bytes() == journal_before
        assert not (run_dir / "results.json").exists()
    finally:
        holder.kill()  # SIGKILL: the kernel releases the flock, no stale lock is left
        holder.wait()
    done = run_cli(["run", "--resume", str(run_dir), "--format", "json"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["complete"] is True


def test_live_run_refuses_resume_and_reuse_then_resumes_after_sigkill(
        tmp_path: Path, write_ladder: Callable[..., Path]) -> None:
    ladder = write_ladder([
        {"id": "first", "step": 1, "kind": "dummy.pass"},
        {"id": "slow", "step": 2, "kind": "dummy.sleep", "params": {"seconds": 300, "marker": "slow.started"}},
    ])
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(ladder), "--device", "cpu",
                             "--out", str(run_dir), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "slow.started").exists():
            assert proc.poll() is None, "run ended before the slow check started"
            assert time.monotonic() < deadline, "slow check never started"
            time.sleep(0.2)
        for args in (["run", "--resume", str(run_dir)],
                     ["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(run_dir)]):
            done = run_cli(args)
            assert done.returncode == 2, done.stderr
            line = _one_line_error(done.stderr)
            assert f"pid {proc.pid}" in line and "in use" in line
        assert _ran(run_dir) == 1  # 'first' was not run a second time
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (run_dir / LOCK_FILE).exists()  # the file stays; its flock went with the process
    done = run_cli(["run", "--resume", str(run_dir), "--format", "json"])
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert [c["id"] for c in results["checks"]] == ["first", "slow"] and results["complete"] is True
    assert _ran(run_dir) == 1
