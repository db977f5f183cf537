"""procs: what an in-process engine sets in os.environ stays out of the children started later;
whether a host is this machine; a real process tree's members and resident memory; a child
that dies with its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptcheck.base import procs

REPO = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not procs.IS_LINUX, reason="/proc and prctl are Linux's")


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(procs, "_PROCESS_LOCAL", {})
    yield


def test_changes_inside_the_block_are_left_out_of_children(clean_registry: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AC_TEST_USER", "mine")
    monkeypatch.setenv("AC_TEST_CHANGED", "before")
    monkeypatch.delenv("AC_TEST_ADDED", raising=False)
    with procs.process_local_environ():
        os.environ["AC_TEST_ADDED"] = "engine"  # e.g. VLLM_ENABLE_V1_MULTIPROCESSING=0
        os.environ["AC_TEST_CHANGED"] = "engine"
    monkeypatch.setenv("AC_TEST_LATER", "set after the block")  # a caller's own change still reaches children
    env = procs.child_environ()
    assert "AC_TEST_ADDED" not in env
    assert env["AC_TEST_CHANGED"] == "before"
    assert env["AC_TEST_USER"] == "mine" and env["AC_TEST_LATER"] == "set after the block"
    assert os.environ["AC_TEST_ADDED"] == "engine"  # the process itself keeps what its engine needs
    # A given base is cleaned the same way.
    assert procs.child_environ({"AC_TEST_ADDED": "x", "K": "v"}) == {"K": "v", "AC_TEST_CHANGED": "before"}
    monkeypatch.delenv("AC_TEST_ADDED")


def test_nothing_recorded_leaves_the_environment_as_it_is(clean_registry: None) -> None:
    with procs.process_local_environ():
        pass
    assert procs.child_environ() == dict(os.environ)


# --- loopback -----------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "127.255.255.254", "localhost", "LocalHost", "::1",
                                  "[::1]", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", " 127.0.0.1 "])
def test_loopback_hosts(host: str) -> None:
    assert procs.is_loopback_host(host)


@pytest.mark.parametrize("host", ["127.example.com", "127.0.0.1.nip.io", "localhost.example.com", "mylocalhost",
                                  "128.0.0.1", "10.0.0.1", "0.0.0.0", "::", "::2", "::ffff:10.0.0.1", "[::2]",
                                  "fe80::1", "", "example.com"])
def test_other_hosts_are_not_loopback(host: str) -> None:
    """A name is not resolved: one that merely starts like 127.x is someone else's machine."""
    assert not procs.is_loopback_host(host)


@pytest.mark.parametrize(("url", "loopback"), [
    ("http://127.0.0.1:8000/v1", True), ("https://localhost/v1", True), ("http://[::1]:8000/v1", True),
    ("localhost:8000", True), ("127.0.0.1:8000/v1", True), ("http://user:pw@127.0.0.1:1/v1", True),
    ("http://127.example.com:8000/v1", False), ("http://10.1.2.3:8000/v1", False), ("[::2]:80", False),
    ("http://127.0.0.1.evil.example/v1", False), ("", False),
])
def test_loopback_urls(url: str, loopback: bool) -> None:
    assert procs.is_loopback_url(url) is loopback


# --- a process tree ------------------------------------------------------------------------

HOLD_MIB = 64
"""What the grandchild holds resident: well above the few MiB a Python's own RSS moves by."""

_TREE_CHILD = textwrap.dedent("""
    import subprocess, sys, time
    # The grandchild writes every page of its buffer (a zeroed allocation would not be resident).
    hold = "b = bytearray(b'x') * ({mib} << 20); print('ready', flush=True); import time; time.sleep(120)"
    grandchild = subprocess.Popen([sys.executable, "-c", hold])
    grandchild.wait()
""")


def _own_rss_mib(pid: int) -> float:
    """``pid``'s own VmRSS, read independently of the code under test."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise AssertionError(f"no VmRSS for {pid}")


@linux_only
def test_tree_rss_counts_a_grandchild_that_holds_memory() -> None:
    child = subprocess.Popen([sys.executable, "-c", _TREE_CHILD.format(mib=HOLD_MIB)], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"  # the grandchild's line, through the inherited pipe
        tree = procs.descendants(child.pid)
        assert len(tree) == 1 and procs.children(child.pid) == tree
        grandchild = tree[0]
        assert procs.pid_alive(child.pid) and procs.pid_alive(grandchild)
        total = procs.tree_rss_mib(child.pid)
        own, held = _own_rss_mib(child.pid), _own_rss_mib(grandchild)
        assert total is not None
        # The tree is the child plus the grandchild: above the child alone by what the grandchild holds.
        assert total - own >= HOLD_MIB * 0.95
        assert total == pytest.approx(own + held, abs=2.0)
        assert procs.tree_rss_mib(grandchild) == pytest.approx(held, abs=2.0)  # a leaf: itself alone
    finally:
        procs.kill_group(child, wait_s=10)
    assert procs.tree_rss_mib(child.pid) is None  # gone (reaped): nothing to read
    assert not procs.pid_alive(child.pid)


# --- parent death --------------------------------------------------------------------------

_PARENT = textwrap.dedent("""
    import subprocess, sys, time
    arm = {arm!r}
    child_code = (
        "import os, signal, sys, time\\n"
        "sys.path.insert(0, %r)\\n"
        "from adaptcheck.base import procs\\n"
        "if %r:\\n"
        "    procs.set_parent_death_signal(signal.SIGKILL)\\n"
        "print(os.getpid(), os.getppid(), flush=True)\\n"
        "time.sleep(120)\\n"
    ) % ({repo!r}, arm)
    child = subprocess.Popen([sys.executable, "-c", child_code])
    child.wait()
""")


def _child_after_parent_killed(arm: bool, wait_s: float) -> tuple[int, bool]:
    """(child pid, whether it was still alive ``wait_s`` after its parent was SIGKILLed)."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT.format(repo=str(REPO), arm=arm)],
                              stdout=subprocess.PIPE, text=True)
    child_pid = 0
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline().split()
        assert line, f"the parent script died: exit {parent.wait()}"
        child_pid, its_parent = int(line[0]), int(line[1])
        assert its_parent == parent.pid and procs.pid_alive(child_pid)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + wait_s
        while procs.pid_alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return child_pid, procs.pid_alive(child_pid)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child_pid and procs.pid_alive(child_pid):  # never leave one behind
            os.kill(child_pid, signal.SIGKILL)


@linux_only
def test_a_child_with_the_parent_death_signal_dies_with_its_parent() -> None:
    _, alive = _child_after_parent_killed(arm=True, wait_s=10.0)  # dies within milliseconds
    assert not alive


@linux_only
def test_without_it_the_child_outlives_a_killed_parent() -> None:
    """The control: what the signal prevents really happens without it."""
    _, alive = _child_after_parent_killed(arm=False, wait_s=1.0)
    assert alive


@pytest.mark.skipif(procs.IS_LINUX, reason="where prctl exists it succeeds")
def test_no_prctl_is_an_os_error() -> None:
    with pytest.raises(OSError):
        procs.set_parent_death_signal(signal.SIGKILL)


@linux_only
def test_a_refused_prctl_is_an_os_error() -> None:
    with pytest.raises(OSError):
        procs.prctl(procs.PR_SET_PDEATHSIG, 999)  # not a signal: EINVAL
