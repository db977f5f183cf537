"""perf.soak stops once its memory trends are decided: the looks against a real server and a real load.

The server is ``tests/perf/latency_server.py`` (a real HTTP/SSE process, no model) behind
``tests/perf/leak_proxy.py`` (a relay that keeps N MiB per completion request), so a soak takes
seconds: what is tested is that the looks stop the load generator at the look that decides,
the verdict is that look's, and the details say how long it ran and why it stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks.lifecycle import release
from adaptcheck.steps.perf.soak import SoakCheck, SoakParams
from tests.perf.latency_server import latency_server
from tests.steps.perf.test_soak import leak_proxy

pytestmark = pytest.mark.slow  # two real soaks of 6-12 s each, processes started: outside the fast lane

# Looks at 6, 12 and 18 s, sampled every 0.2 s after a 1 s warm-up. The bound is wide for a
# relay (whose RSS moves by its sockets and buffers); the leak (2 MiB a request at some
# 20 req/s) is two orders of magnitude above it.
SOAK: dict[str, Any] = {"framework": "endpoint", "duration_s": 6, "max_duration_s": 18, "looks": 3, "warmup_s": 1,
                        "sample_interval_s": 0.2, "level": 2, "max_growth_mib_per_min": 60,
                        "mixed": [{"input_tokens": 16, "output_tokens": 8, "weight": 1}], "request_timeout_s": 10}


def soak(run_dir: Path, leak_mib: float) -> Outcome:
    with latency_server(ttft_ms=20.0, itl_ms=5.0) as (upstream, _), leak_proxy(upstream, leak_mib) as url:
        ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=run_dir, model=ModelSpec(),
                           check_id="perf.soak", endpoint={"url": url, "model": None, "reference": False})
        try:
            return SoakCheck().run(ctx, SoakParams(**SOAK))
        finally:
            release(ctx)


def last_start_s(run_dir: Path, outcome: Outcome) -> float:
    """When the last measured request was sent, on the load generator's clock (s from its start)."""
    lines = [json.loads(x) for x in (run_dir / outcome.details["records_file"]).read_text().splitlines()]
    return max(x["sent_s"] for x in lines if not x["warmup"])


@pytest.mark.parametrize(("leak_mib", "status", "state"), [(0.0, Status.PASS, "within"), (2.0, Status.FAIL, "over")])
def test_the_soak_stops_at_the_look_that_decides(tmp_path: Path, leak_mib: float, status: Status, state: str) -> None:
    outcome = soak(tmp_path, leak_mib)
    assert outcome.status == status, outcome.message
    d = outcome.details["decision"]
    assert d["looks_at_s"] == [6.0, 12.0, 18.0] and d["look_confidence"] == pytest.approx(1 - 0.05 / 3)
    assert d["stop"] == "decided" and d["stopped_at_s"] in d["looks_at_s"][:2], d
    assert d["looks"][-1]["states"]["server_rss_mib"] == state
    # The load stopped at that look (requests in flight finished), before the 18 s budget.
    assert d["ran_s"] < d["stopped_at_s"] + 3 and last_start_s(tmp_path, outcome) < d["stopped_at_s"] + 0.5
    rss = next(m for m in outcome.details["memory"] if m["series"] == "server_rss_mib")
    assert rss["state"] == state and rss["fit"]["t_end_s"] <= d["stopped_at_s"]
    assert rss["confidence"] == pytest.approx(d["look_confidence"])
    assert outcome.message.startswith(f"soak {d['ran_s']:.0f} s (decided at {d['stopped_at_s']:.4g} s, look ")
    assert outcome.details["soak"]["max_duration_s"] == 18 and outcome.details["soak"]["looks"] == 3
    assert outcome.metrics["soak_s"] == d["ran_s"]
