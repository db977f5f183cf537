"""Child processes and ports: the plumbing every launcher shares (the isolated worker, the
collectives ranks, the inference servers).

An engine loaded in this process may change ``os.environ`` for itself (vLLM in process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, and vLLM sets shared-memory names and its worker start
method); a server started later must not inherit that, or it runs as a different program
(measured: a ``vllm serve`` started after the in-process vLLM ran its model inside the
EngineCore without thread binding). :func:`process_local_environ` records such changes and
:func:`child_environ` gives a child the environment without them.

Sessions and process groups, as the ``Popen`` calls have them today:

- the isolated worker (:mod:`adaptcheck.ladder.runner`) and every collectives rank
  (:mod:`adaptcheck.collectives.launch`) are started with ``start_new_session=True``: each
  leads its own session and process group, so one :func:`kill_group` reaches whatever it
  forked (a collective library's helpers, a server tree); a hung driver call ignores
  gentler signals, hence SIGKILL;
- an inference server (:mod:`adaptcheck.frameworks.server`: its reaper and the server
  under it) and the short ``subprocess.run`` probes are *not*: they stay in the group of
  the process that started them, so killing the isolated worker's group kills them too.

A child that must not outlive its parent even when the parent is SIGKILLed (no ``finally``
runs then) asks the kernel for a signal on its parent's death
(:func:`set_parent_death_signal`): the collectives ranks, which lead their own sessions and
so escape the worker's ``killpg``, and a server's reaper.

Also here, because every layer above needs them and none may import the others: whether a
host is this machine (:func:`is_loopback_host`), and a process tree read from ``/proc``
(:func:`descendants`, :func:`pid_alive`, :func:`tree_rss_mib`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

IS_LINUX = sys.platform.startswith("linux")
"""Where ``/proc`` and ``prctl`` exist (elsewhere: psutil where installed, or nothing)."""
PR_SET_PDEATHSIG = 1
"""``prctl`` option (``<linux/prctl.h>``): the signal this process gets when its parent dies."""
PR_SET_CHILD_SUBREAPER = 36
"""``prctl`` option: orphans in this process's subtree are re-parented to it, not to init."""

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
    most ``wait_s``; None: as long as it takes). False when it was still not reaped.

    ``proc`` must lead its group (``start_new_session=True``); one that does not has no
    group of its own to kill, and only ``proc`` itself dies."""
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


# --------------------------------------------------------------------------- loopback --

def is_loopback_host(host: str) -> bool:
    """``host`` (a name or an IP literal, IPv6 with or without brackets) is this machine:
    ``localhost``, 127.0.0.0/8, ``::1`` (or an IPv4-mapped 127.x).

    Names other than ``localhost`` are not resolved: ``127.example.com`` is someone else's
    machine, although it starts like a loopback address.
    """
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return False
    # ::ffff:127.0.0.1 is loopback too, though older Pythons' is_loopback says no.
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def is_loopback_url(url: str) -> bool:
    """The host of ``url`` (``http://`` assumed without a scheme) is this machine (:func:`is_loopback_host`)."""
    return is_loopback_host(urlsplit(url if "://" in url else "http://" + url).hostname or "")


# ----------------------------------------------------------------------- process tree --

def _children_map() -> dict[int, list[int]]:
    """ppid → pids of every live (non-zombie) process, from /proc (no psutil needed)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        # "pid (comm) state ppid …" — comm may contain spaces and parentheses.
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) < 2 or rest[0] in ("Z", "X"):
            continue
        out.setdefault(int(rest[1]), []).append(int(entry))
    return out


def children(pid: int) -> list[int]:
    """The live direct children of ``pid`` (Linux; [] elsewhere)."""
    return _children_map().get(pid, []) if IS_LINUX else []


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, parents before children."""
    if not IS_LINUX:
        try:
            import psutil  # type: ignore[import-untyped,unused-ignore]  # no stubs installed

            return [int(p.pid) for p in psutil.Process(pid).children(recursive=True)]
        except Exception:  # noqa: BLE001 - best effort where /proc is missing
            return []
    tree = _children_map()
    out: list[int] = []
    todo = list(tree.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    if IS_LINUX:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            return False
        return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tree_rss_mib(pid: int) -> float | None:
    """Resident memory of ``pid`` and every descendant (MiB), from /proc; None when ``pid``
    is gone or no member's memory was readable (not Linux).

    Summed per process: pages two members share (a forked engine's copy-on-write pages,
    shared memory) count once per member, as ``ps`` and ``top`` count them.
    """
    if not pid_alive(pid):
        return None
    total_kib = 0
    seen = False
    for p in [pid, *descendants(pid)]:
        try:
            text = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue  # exited meanwhile: nothing of it is resident any more
        m = re.search(r"^VmRSS:\s+(\d+)\s+kB", text, re.MULTILINE)
        if m:  # a kernel thread or a zombie has no VmRSS line
            total_kib += int(m.group(1))
            seen = True
    return total_kib / 1024.0 if seen else None


# ----------------------------------------------------------------------- parent death --

def prctl(option: int, arg: int) -> None:
    """Linux ``prctl(option, arg)`` for this process; OSError when it fails or where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.prctl
    except (OSError, AttributeError):  # not Linux, or a libc without prctl
        raise OSError(errno.ENOSYS, "prctl is not available here") from None
    if call(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def set_parent_death_signal(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies, however it dies
    (SIGKILL included, when no cleanup code of the parent runs). OSError where unsupported.

    Call it in the child (its own start-up, or a ``preexec_fn``), then check that
    ``os.getppid()`` is still the parent expected: one that died before the call is not
    signalled, and the child has been re-parented already. The signal follows the *thread*
    that forked the child: fork from a thread that outlives the child.
    """
    prctl(PR_SET_PDEATHSIG, int(sig))
