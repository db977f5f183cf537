"""The lock on a run folder: one process at a time runs, resumes or finishes a run there.

Two processes appending to one ``checks.jsonl`` would run checks twice (doubling the load
that the serving step measures) and interleave their records. The holder takes an exclusive
``fcntl.flock`` on ``run.lock`` inside the folder for the whole life of the run. The kernel
releases it when the process ends in any way, SIGKILL included, so a killed run never leaves
a stale lock and can be resumed at once. The file is never deleted (deleting a flock'ed file
lets a third process lock a new inode while the second still holds the old one); its content,
rewritten by each holder, says who holds it so a refusal can name them.

Linux (and other POSIX systems) only, like the rest of adaptcheck's runner; importing this
module elsewhere works and taking a lock there is refused with a one-line error.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType

from adaptcheck.base.errors import InvalidInputError, UsageError

try:  # POSIX only; adaptcheck's runner does not support Windows.
    import fcntl
except ImportError:  # pragma: no cover - exercised only off POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "run.lock"
"""The lock's file name inside the run folder (kept after the run; its flock is what counts)."""

_HOLDER_WAIT_S = 1.0
"""How long a refused process waits for a holder that has just taken the lock to write who it is."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a run folder's lock."""

    pid: int | None
    host: str
    since: str
    command: str

    def describe(self) -> str:
        """'pid 123 on node3 (adaptcheck run --resume, since 2025-01-01T10:00:00Z)'."""
        pid = f"pid {self.pid}" if self.pid is not None else "another process"
        return f"{pid} on {self.host or 'an unknown host'} ({self.command or 'unknown command'}, since {self.since or '?'})"


class RunLock:
    """A held lock; release it (or leave the ``with`` block, or end the process) to let others in."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock and close; the file stays. Idempotent."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __del__(self) -> None:
        # A holder dropped without release (an error between taking the lock and the run):
        # closing the descriptor is what frees a flock.
        try:
            self.release()
        except OSError:
            pass

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def read_holder(run_dir: Path) -> Holder | None:
    """What ``run.lock`` says about its holder, or None when it says nothing readable."""
    try:
        data = json.loads((Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid = data.get("pid")
    return Holder(pid=pid if isinstance(pid, int) else None, host=str(data.get("host", "")),
                  since=str(data.get("since", "")), command=str(data.get("command", "")))


def acquire(run_dir: Path, command: str) -> RunLock:
    """Take the lock on ``run_dir`` (which must exist) without waiting.

    ``command`` names the holder in a refusal ('adaptcheck run --resume'); it is written to
    the lock file as given, so pass a label, never a command line that may carry a secret.
    A folder already held is a :class:`UsageError` (exit 2) naming the holder; a folder where
    the lock file cannot be created is an :class:`InvalidInputError` (exit 3).
    """
    run_dir = Path(run_dir)
    path = run_dir / LOCK_FILE
    if fcntl is None:  # pragma: no cover - off POSIX
        raise UsageError("runs need a POSIX system (Linux) to lock their folder",
                         hint="run adaptcheck on Linux")
    try:
        # No O_TRUNC: a process that is refused must not wipe the holder's description.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise InvalidInputError(f"{run_dir}: cannot create the run lock {path.name}: {exc.strerror or exc}",
                                hint="the run folder must be writable") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = _wait_for_holder(run_dir)
        who = holder.describe() if holder is not None else "another process"
        raise UsageError(f"{run_dir} is in use by {who}",
                         hint="wait for it to finish, or stop it; a killed run can then be finished with --resume") from None
    except OSError as exc:
        os.close(fd)
        raise InvalidInputError(f"{run_dir}: cannot lock {path.name}: {exc.strerror or exc}",
                                hint="the run folder must be on a file system that supports flock") from None
    try:
        _write_holder(fd, command)
    except OSError:
        # The description is informative only; the flock itself is what protects the folder.
        pass
    return RunLock(path, fd)


def _write_holder(fd: int, command: str) -> None:
    since = datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since, "command": command}) + "\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode("utf-8"), 0)
    os.fsync(fd)


def _wait_for_holder(run_dir: Path) -> Holder | None:
    """The holder's description; a holder that has only just locked gets a moment to write it."""
    deadline = time.monotonic() + _HOLDER_WAIT_S
    while True:
        holder = read_holder(run_dir)
        if holder is not None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.05)
