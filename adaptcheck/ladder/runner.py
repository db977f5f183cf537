"""Execute a ladder's checks in an isolated, restartable worker process.

Each check gets a time limit. A check that raises is recorded as ``error`` with the
exception; one that kills its process (segfault, abort, OOM-kill) or exceeds its limit is
recorded as ``error`` with the signal or the limit, the worker is replaced, and the run
goes on. Every finished check is appended to ``checks.jsonl`` and fsync'ed before the next
one starts, so a runner killed with SIGKILL loses only the check in flight.
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from adaptcheck.base.procs import child_environ, kill_group
from adaptcheck.base.schemas.evidence import Evidence
from adaptcheck.base.schemas.ladder import CheckSpec
from adaptcheck.base.schemas.results import CheckResult
from adaptcheck.ladder.check import Check, Outcome
from adaptcheck.ladder.protocol import CheckRequest, ProgressReport, WorkerInit, WorkerReply

WORKER_STARTUP_TIMEOUT_S = 180.0
"""Importing torch and a vendor extension can be slow on first use; a broken driver can hang it."""

ProgressCallback = Callable[[ProgressReport], None]
"""Receives a check's progress report (see CheckContext.progress)."""


class WorkerDied(Exception):
    """The worker process ended or was killed; ``reason`` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "unknown exit"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class Worker:
    """One worker process and its two pipes."""

    def __init__(self, init: WorkerInit, log_path: Path) -> None:
        self.init = init
        self.log_path = log_path
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        self._log = open(log_path, "ab")
        env = child_environ()  # not what an in-process engine in this process set for itself
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "adaptcheck.ladder.worker", str(cmd_r), str(res_w)],
            pass_fds=(cmd_r, res_w),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a hang is killed with all its children
            env=env,
        )
        os.close(cmd_r)
        os.close(res_w)
        self._cmd = os.fdopen(cmd_w, "w", encoding="utf-8")
        self._res_fd = res_r
        self._buf = b""
        self._send(init)
        reply = self._receive(WORKER_STARTUP_TIMEOUT_S, what="worker start-up")
        if not reply.ready:
            self.kill()
            raise WorkerDied(f"worker could not set up the device context: {reply.error or 'unknown error'}")

    def _send(self, obj: WorkerInit | CheckRequest) -> None:
        try:
            self._cmd.write(json.dumps(obj) + "\n")
            self._cmd.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(self._death_reason()) from None

    def _receive(self, timeout_s: float, what: str, on_progress: ProgressCallback | None = None,
                 check_id: str | None = None) -> WorkerReply:
        """The next reply line. Progress lines of ``check_id`` on the way are handed to
        ``on_progress`` (those of another check, late from an earlier one, are dropped) and the
        wait goes on: the time limit covers the whole check, not the gap between messages."""
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\n" not in self._buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.kill()
                    raise WorkerDied(f"{what} exceeded its time limit of {timeout_s:g} s and was killed")
                ready, _, _ = select.select([self._res_fd], [], [], min(remaining, 1.0))
                if not ready:
                    continue
                chunk = os.read(self._res_fd, 65536)
                if not chunk:
                    raise WorkerDied(self._death_reason())
                self._buf += chunk
            line, _, self._buf = self._buf.partition(b"\n")
            try:
                msg = WorkerReply.model_validate_json(line)
            except ValidationError as exc:
                self.kill()
                raise WorkerDied(f"the worker answered a malformed line ({exc.error_count()} errors): "
                                 f"{line[:200]!r}") from None
            if msg.is_progress:
                if on_progress is not None and msg.id == check_id and msg.progress is not None:
                    try:
                        on_progress(msg.progress)
                    except Exception:  # noqa: BLE001 - a display problem must not cost the check its result
                        pass
                continue
            return msg

    def _death_reason(self) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        return f"the check's process died ({_signal_name(rc)}){self._log_tail()}"

    def _log_tail(self) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return f"; last output: {lines[-1][:300]}" if lines else ""

    def run(self, msg: CheckRequest, timeout_s: float, on_progress: ProgressCallback | None = None) -> WorkerReply:
        self._send(msg)
        return self._receive(timeout_s, what=f"check {msg['id']!r}", on_progress=on_progress, check_id=msg["id"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (a hung driver call ignores gentler signals)."""
        if self.proc.poll() is None:
            kill_group(self.proc, wait_s=10)
        self.close()

    def close(self) -> None:
        for closer in (self._cmd.close, lambda: os.close(self._res_fd), self._log.close):
            try:
                closer()
            except OSError:
                pass

    def stop(self) -> None:
        """Graceful end: close its command pipe, give it a moment, then kill."""
        try:
            self._cmd.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


@dataclass
class PlannedRun:
    """One check to execute."""

    spec: CheckSpec
    timeout_s: float


def _kind_class(spec: CheckSpec) -> type[Check] | None:
    """The spec's kind class; None when it cannot be loaded now (a plugin gone since the ladder
    was loaded): its results are still written, without what the class would add."""
    from adaptcheck.ladder.registry import get_check_class

    try:
        return get_check_class(spec.kind)
    except Exception:  # noqa: BLE001 - a result must be written whatever this raises
        return None


def _identity(spec: CheckSpec, cls: type[Check] | None) -> Evidence | None:
    """``Check.identity`` of the spec's kind: the evidence a result written in its place carries.

    The ladder loader validated these params with this kind already; should that fail now, the
    result goes without it rather than hiding the check's own error.
    """
    if cls is None:
        return None
    try:
        return cls.identity(cls.params_model.model_validate(spec.params))
    except Exception:  # noqa: BLE001 - the error result must be written whatever this raises
        return None


def _error(spec: CheckSpec, cls: type[Check] | None, message: str, traceback: str | None = None) -> Outcome:
    """The ``error`` outcome of a check that could not complete, with its kind's identity evidence."""
    identity = _identity(spec, cls)
    outcome = Outcome.errored(message, details=identity.dump() if identity is not None else {})
    if traceback is not None:
        outcome.details["traceback"] = traceback
    return outcome


def _result(spec: CheckSpec, cls: type[Check] | None, check_id: str, outcome: Outcome, duration_s: float) -> CheckResult:
    """``outcome`` as a result of ``spec``, recording its kind's report label and what it compares."""
    return CheckResult(id=check_id, step=spec.step, kind=spec.kind, tags=spec.tags,
                       kind_label=cls.label if cls is not None else None,
                       compares=cls.compares if cls is not None else None,
                       status=outcome.status, message=outcome.message, metrics=outcome.metrics,
                       details=outcome.details, applicable=outcome.applicable, duration_s=duration_s)


def _to_results(spec: CheckSpec, reply: WorkerReply) -> list[CheckResult]:
    cls = _kind_class(spec)
    if reply.exception is not None:
        raised = _error(spec, cls, f"check raised {reply.exception}", reply.traceback)
        return [_result(spec, cls, spec.id, raised, reply.duration_s)]
    if not reply.outcomes:
        return error_results(spec, "the worker answered without an outcome", reply.duration_s)
    per = reply.duration_s / len(reply.outcomes)
    return [_result(spec, cls, f"{spec.id}.{o.subid}" if o.subid else spec.id, o, per) for o in reply.outcomes]


def error_results(spec: CheckSpec, message: str, duration_s: float = 0.0) -> list[CheckResult]:
    """The single ``error`` result of a check that could not complete."""
    cls = _kind_class(spec)
    return [_result(spec, cls, spec.id, _error(spec, cls, message), duration_s)]


TORN_SUFFIX = ".torn"
"""Where :meth:`JournalWriter.repair` keeps the bytes of journal lines it sets aside."""


@dataclass
class JournalRepair:
    """What :meth:`JournalWriter.repair` set aside: the number of bad fragments and where they went."""

    fragments: int
    torn_path: Path


class JournalWriter:
    """Append-only ``checks.jsonl``: one record per finished check, durable before the next starts."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, spec_id: str, results: list[CheckResult]) -> None:
        from adaptcheck.base.redact import scrub_text

        record = {"spec_id": spec_id, "results": [r.model_dump(mode="json") for r in results]}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(scrub_text(json.dumps(record)) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read(self) -> dict[str, list[CheckResult]]:
        """Finished checks by spec id. A torn or unreadable line (killed mid-write) is ignored."""
        done: dict[str, list[CheckResult]] = {}
        for _raw, parsed in self._lines():
            if parsed is not None:
                done[parsed[0]] = parsed[1]
        return done

    def repair(self) -> JournalRepair | None:
        """Make the journal safe to append to; None when it already was.

        A runner killed mid-write leaves a last line without its newline: the next record
        would be glued onto it and both lost. Every line that is torn (no newline) or does not
        parse as a record is appended, byte for byte, to ``checks.jsonl.torn`` for a post-mortem,
        and the journal is replaced atomically by its good lines only. The checks whose records
        were set aside are simply not done, so the resume runs them again.
        """
        good: list[bytes] = []
        bad: list[bytes] = []
        for raw, parsed in self._lines():
            (good if parsed is not None else bad).append(raw)
        if not bad:
            return None
        from adaptcheck.base.atomic import write_text_atomic

        torn = self.path.with_name(self.path.name + TORN_SUFFIX)
        # Append, so fragments from several interrupted resumes are all kept; each on its own
        # line even when it had no newline of its own.
        with open(torn, "ab") as fh:
            for raw in bad:
                fh.write(raw if raw.endswith(b"\n") else raw + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        # Good lines are whole JSON records, hence ASCII/UTF-8 text that decodes unchanged.
        write_text_atomic(self.path, b"".join(good).decode("utf-8"))
        return JournalRepair(fragments=len(bad), torn_path=torn)

    def _lines(self) -> list[tuple[bytes, tuple[str, list[CheckResult]] | None]]:
        """Each raw line (with its newline, if it has one) and its record, or None when it is bad."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        # Split on "\n" only: that is the record separator append() writes.
        pieces = [p + b"\n" for p in data.split(b"\n")]
        pieces[-1] = pieces[-1][:-1]  # what follows the last newline: b"" or a torn line
        return [(raw, _parse_record(raw) if raw.endswith(b"\n") else None) for raw in pieces if raw]


def _labelled(result: CheckResult) -> CheckResult:
    """A journalled result as a fresh one records it: a journal written before results 1.4 (a run
    resumed across the upgrade) has no kind label, and ``results.json``'s upgrade never sees it,
    so the label and what it compares are taken from the kind, as :func:`_result` does."""
    if result.kind_label is not None:
        return result
    from adaptcheck.ladder.registry import get_check_class

    try:
        cls = get_check_class(result.kind)
    except Exception:  # noqa: BLE001 - a plugin gone since: the record stands as written
        return result
    return result.model_copy(update={"kind_label": cls.label, "compares": result.compares or cls.compares})


def _parse_record(raw: bytes) -> tuple[str, list[CheckResult]] | None:
    """A journal line's (spec id, results), or None when it is not a whole, valid record."""
    if not raw.strip():
        return None
    try:
        rec = json.loads(raw.decode("utf-8"))
        spec_id = rec["spec_id"]
        if not isinstance(spec_id, str):
            return None
        return spec_id, [_labelled(CheckResult.model_validate(r)) for r in rec["results"]]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError):
        return None


def execute(
    planned: Iterable[PlannedRun],
    init: WorkerInit,
    journal: JournalWriter,
    log_path: Path,
    on_start: Callable[[CheckSpec], None] | None = None,
    on_done: Callable[[CheckSpec, list[CheckResult]], None] | None = None,
    on_progress: Callable[[CheckSpec, ProgressReport], None] | None = None,
) -> dict[str, list[CheckResult]]:
    """Run each planned check in the worker, replacing the worker after any death."""
    worker: Worker | None = None
    finished: dict[str, list[CheckResult]] = {}
    try:
        for item in planned:
            spec = item.spec
            if on_start:
                on_start(spec)
            start = time.perf_counter()
            try:
                if worker is None or not worker.alive():
                    worker = Worker(init, log_path)
                report = functools.partial(on_progress, spec) if on_progress else None
                reply = worker.run({"id": spec.id, "kind": spec.kind, "params": spec.params}, item.timeout_s, report)
                results = _to_results(spec, reply)
            except WorkerDied as died:
                if worker is not None:
                    worker.kill()
                worker = None
                results = error_results(spec, died.reason, time.perf_counter() - start)
            journal.append(spec.id, results)
            finished[spec.id] = results
            if on_done:
                on_done(spec, results)
    except BaseException:
        # Interrupted (Ctrl-C) or failing: a check in flight may be hung, so do not wait for it.
        if worker is not None:
            worker.kill()
        raise
    if worker is not None:
        worker.stop()
    return finished
