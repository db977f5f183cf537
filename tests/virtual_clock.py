"""Virtual time for code whose threads wait on a clock: the test drives time, nobody sleeps.

Code under test takes the clock as ``clock`` (read the time) and ``wait`` (wait on an event
with a timeout) or ``sleep``; a :class:`VirtualClock` provides all three. Time moves only in
:meth:`VirtualClock.run_for`, and only when every thread under test is blocked on the clock:
it then jumps to the earliest deadline, wakes whoever was due, and waits for them to block
again. Each thread's work between waits (reading ``/proc``, running a fake tool) costs no
virtual time, so stamps come out exact: a sampler on a grid of 0.1 s stamps 0.0, 0.1, 0.2 …,
and work that is meant to take time (a slow vendor tool) says so with :meth:`sleep`.

An event set from outside (a sampler's stop) releases a thread blocked in :meth:`wait` within
a few real milliseconds, as ``threading.Event.wait`` would.
"""

from __future__ import annotations

import itertools
import threading
import time

REAL_TIMEOUT_S = 10.0
"""How long (real time) :meth:`VirtualClock.run_for` waits for the threads to block again."""
POLL_S = 0.005
"""How often (real time) a blocked thread looks whether its event was set."""


class VirtualClock:
    """A clock for ``threads`` threads under test, starting at ``start`` (not 0: code under test
    must measure from its own start, not from the clock's zero)."""

    def __init__(self, threads: int, start: float = 1000.0) -> None:
        self.threads = threads
        self._now = start
        self._cond = threading.Condition()
        self._due: dict[int, float] = {}  # ticket of each blocked thread → virtual deadline
        self._tickets = itertools.count()

    def __call__(self) -> float:
        with self._cond:
            return self._now

    def sleep(self, seconds: float) -> None:
        self._block(seconds, None)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """``event.wait(timeout)`` in virtual time: True when the event is set, False at the deadline."""
        return self._block(timeout, event)

    def _block(self, seconds: float, event: threading.Event | None) -> bool:
        with self._cond:
            if event is not None and event.is_set():
                return True
            ticket = next(self._tickets)
            self._due[ticket] = self._now + max(0.0, seconds)
            self._cond.notify_all()  # run_for may be waiting for this thread to block
            while ticket in self._due:  # run_for removes it when its deadline comes
                if event is not None and event.is_set():
                    del self._due[ticket]
                    self._cond.notify_all()
                    return True
                self._cond.wait(POLL_S)
            return False

    def run_for(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, deadline by deadline, each step once all
        :attr:`threads` are blocked on the clock (an AssertionError when they do not block within
        :data:`REAL_TIMEOUT_S` real seconds)."""
        with self._cond:
            end = self._now + seconds
            while True:
                limit = time.monotonic() + REAL_TIMEOUT_S
                while len(self._due) < self.threads:
                    left = limit - time.monotonic()
                    assert left > 0, f"{self.threads} thread(s) should wait on the clock, {len(self._due)} do"
                    self._cond.wait(min(left, 0.05))
                next_due = min(self._due.values())
                if next_due > end:
                    self._now = end
                    return
                self._now = next_due
                for ticket in [t for t, due in self._due.items() if due <= next_due]:
                    del self._due[ticket]
                self._cond.notify_all()
