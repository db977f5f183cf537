"""Child processes and ports: the plumbing every launcher shares (the isolated worker, the
collectives ranks, the inference servers).

Each child leads its own session, so one ``killpg`` reaches whatever it forked (a
collective library's helpers, vLLM's engine core); a hung driver call ignores gentler
signals, hence SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks; the caller binds it a moment
    later, and a race with another process is the caller's to retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def kill_group(proc: subprocess.Popen[Any], wait_s: float | None = None) -> bool:
    """SIGKILL ``proc``'s whole process group, then ``proc`` itself, and reap it (waiting at
    most ``wait_s``; None: as long as it takes). False when it was still not reaped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return False
    return True
