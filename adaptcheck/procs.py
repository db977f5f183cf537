"""Child processes and ports: the plumbing every launcher shares (the isolated worker, the
collectives ranks, the inference servers).

An engine loaded in this process may change ``os.environ`` for itself (vLLM in process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, and vLLM sets shared-memory names and its worker start
method); a server started later must not inherit that, or it runs as a different program
(measured: a ``vllm serve`` started after the in-process vLLM ran its model inside the
EngineCore without thread binding). :func:`process_local_environ` records such changes and
:func:`child_environ` gives a child the environment without them.

Each child leads its own session, so one ``killpg`` reaches whatever it forked (a
collective library's helpers, vLLM's engine core); a hung driver call ignores gentler
signals, hence SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

_PROCESS_LOCAL: dict[str, str | None] = {}
"""Variables an in-process engine set or changed, with their value before it (None: unset)."""


@contextlib.contextmanager
def process_local_environ() -> Iterator[None]:
    """Every change made to ``os.environ`` inside the block is this process's own (see module doc)."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) | set(before):
            if os.environ.get(key) != before.get(key):
                _PROCESS_LOCAL.setdefault(key, before.get(key))


def child_environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: ``base`` (default ``os.environ``) without the
    process-local changes, each put back to its value from before the change."""
    env = dict(os.environ if base is None else base)
    for key, old in _PROCESS_LOCAL.items():
        if old is None:
            env.pop(key, None)
        else:
            env[key] = old
    return env


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
