"""What runs beside the load: the client's own cost, and the server's memory.

Responsible for the two things a serving measurement must watch besides latency:

*The client itself.* A Python load generator can saturate before the server does, and
then every latency it reports is the client's. :class:`ClientMonitor` measures, over the
measured window only, the process CPU time (``time.process_time``: every thread of this
process), hence CPU % of one core and µs of client CPU per output token, and the
event-loop lag (a ticker asks to wake every ``tick_s`` and records how late it woke: a loop
busy with other work, or a process the OS does not schedule, wakes late, and so would every
stream timestamp). :func:`client_verdict` turns them into a ``bottleneck`` flag and one
warning line.

*The server.* Which process it is when it runs on this machine (the pid of a launched
server, or the process listening on a loopback endpoint's port: :func:`local_server_pid`;
:func:`adaptcheck.base.procs.tree_rss_mib` reads its tree's resident memory), and vLLM's
KV-cache usage gauge from ``/metrics`` where the server has one, sampled during the window
(its peak is what says how full the cache got).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from adaptcheck.base.procs import is_loopback_host
from adaptcheck.perf.serving_metrics import percentile

if TYPE_CHECKING:
    from adaptcheck.openai_client.client import AsyncOpenAIClient

CPU_BOTTLENECK_PERCENT = 90.0
"""Client CPU (100 = one core) at which the single-threaded event loop is saturated."""
LAG_BOTTLENECK_FRACTION = 0.25
LAG_BOTTLENECK_MIN_MS = 1.5
"""Mean event-loop lag that taints the timings: a quarter of the median ITL, and at least
1.5 ms. The mean, because it is what shifts medians and throughput (a rare late wake-up
only moves the ITL tail); and a floor, because asyncio rounds every timer up to the next
millisecond, so an idle loop already reads ~0.5 ms."""
KV_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
"""vLLM's KV-cache usage gauge (0-1): the current name, then the one before 0.10."""


# --------------------------------------------------------------------------------- client --

@dataclass
class ClientStats:
    """The client's cost over one measured window."""

    cpu_s: float
    wall_s: float
    lag_ms: list[float] = field(default_factory=list)

    @property
    def cpu_percent(self) -> float:
        return 100.0 * self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def lag_p99_ms(self) -> float:
        return percentile(self.lag_ms, 99) if self.lag_ms else 0.0

    def lag_mean_ms(self) -> float:
        return sum(self.lag_ms) / len(self.lag_ms) if self.lag_ms else 0.0

    def overhead_us_per_token(self, output_tokens: int) -> float | None:
        return 1e6 * self.cpu_s / output_tokens if output_tokens else None


class ClientMonitor:
    """CPU time and event-loop lag between :meth:`start` and :meth:`stop` (same event loop)."""

    def __init__(self, tick_s: float = 0.02) -> None:
        self.tick_s = tick_s
        self._cpu0 = 0.0
        self._wall0 = 0.0
        self._lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            due = time.perf_counter() + self.tick_s
            await asyncio.sleep(self.tick_s)
            self._lags.append(max(0.0, (time.perf_counter() - due) * 1000.0))

    async def stop(self) -> ClientStats:
        cpu, wall = time.process_time() - self._cpu0, time.perf_counter() - self._wall0
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return ClientStats(cpu_s=cpu, wall_s=wall, lag_ms=list(self._lags))


def client_verdict(cpu_percent: float, lag_mean_ms: float, lag_p99_ms: float,
                   itl_median_ms: float | None) -> tuple[bool, str]:
    """(bottleneck, warning): whether the client, not the server, limited the run, in one line.

    Two ways it can: the client is CPU-bound (its event loop cannot keep up), or its event
    loop ran late although it had CPU to spare (the OS did not schedule it: client and
    server compete for too few cores). Either way the timings include client delay.
    """
    late = bool(itl_median_ms) and lag_mean_ms >= max(LAG_BOTTLENECK_MIN_MS,
                                                       LAG_BOTTLENECK_FRACTION * (itl_median_ms or 0.0))
    lag = (f"event-loop lag mean {lag_mean_ms:.1f} ms, p99 {lag_p99_ms:.1f} ms, vs median ITL "
           f"{itl_median_ms or 0:.1f} ms")
    if cpu_percent >= CPU_BOTTLENECK_PERCENT:
        why = f"the load generator is CPU-bound ({cpu_percent:.0f}% of one core{'; ' + lag if late else ''})"
        fix = "use fewer concurrent requests or a faster client host"
    elif late:
        why = (f"the load generator's event loop ran late ({lag}) on {cpu_percent:.0f}% of one core: "
               "the host is oversubscribed (client and server compete for cores)")
        fix = "run the client on another host or free cores"
    else:
        return False, ""
    return True, f"{why}; timings include client delay ({fix})"


# --------------------------------------------------------------------------------- server --

def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            # local_address is HEX_IP:HEX_PORT; state 0A is LISTEN.
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def local_server_pid(url: str) -> int | None:
    """The pid listening on a loopback URL's port (this machine only, same user); None otherwise."""
    parts = urlsplit(url if "://" in url else "http://" + url)
    if not is_loopback_host(parts.hostname or ""):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            for fd in (proc / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


def kv_cache_usage(metrics_text: str) -> float | None:
    """The largest KV-cache usage gauge (0-1) in a Prometheus text, over engines; None without one."""
    values = []
    for name in KV_GAUGES:
        for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+(\S+)", metrics_text, re.MULTILINE):
            with contextlib.suppress(ValueError):
                values.append(float(m.group(1)))
        if values:
            break
    return max(values) if values else None


class ServerSampler:
    """Samples the KV-cache gauge every ``interval_s`` while a window runs; keeps the peak.

    Only a regex over ``/metrics`` runs in the event loop (not a full parse): a sample costs
    tens of microseconds of the loop's time. A server without ``/metrics`` is asked once.
    """

    def __init__(self, client: AsyncOpenAIClient, interval_s: float = 0.5) -> None:
        self.client = client
        self.interval_s = interval_s
        self.kv_peak: float | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Take the first sample now (the connection pool is set up before the window), then keep sampling."""
        if await self._sample():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _sample(self) -> bool:
        """One sample; False when there is nothing to sample (no /metrics, no gauge, no answer)."""
        from adaptcheck.openai_client.errors import EndpointError

        try:
            text = await self.client.metrics_text()
        except EndpointError:
            return False
        value = kv_cache_usage(text) if text is not None else None
        if value is None:
            return False
        self.kv_peak = value if self.kv_peak is None else max(self.kv_peak, value)
        return True

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if not await self._sample():
                return

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
