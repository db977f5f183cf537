"""``perf.serving`` end to end: against the session's real vLLM server, through a faulty proxy, and with none.

The check is run in process on ``framework: endpoint`` pointed at the session's ``vllm serve``
(so no second server is started), and once through the CLI to see it registered and its
records written beside results.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.frameworks.base import Availability
from adaptcheck.frameworks.endpoint_fw import (
    TransformersServeFramework,
    VllmServeFramework,
)
from adaptcheck.frameworks.server import ManagedServer
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks.lifecycle import release
from adaptcheck.steps.perf.serving import ServingCheck, ServingParams, resolve_framework
from tests.conftest import run_cli
from tests.perf.fault_proxy import fault_proxy

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

RUN_SUMMARY_KEYS = ["completed", "failed", "error_rate", "errors", "duration_s", "request_throughput",
                    "output_throughput", "total_input_tokens", "total_output_tokens", "token_source",
                    "token_mismatches", "ttft_ms", "tpot_ms", "itl_ms", "itl_per_token_ms", "itl_basis", "e2el_ms",
                    "queue_ms", "goodput", "slo_attainment", "chunks_per_token"]
TINY: dict[str, Any] = {"input_tokens": 24, "output_tokens": 6, "num_requests": 4, "min_runs": 2, "max_runs": 2,
                        "host": {"max_other_cores": 1000.0}}
"""Two runs per level; host noise not judged (a shared test machine; tests/steps/perf/test_serving_stability.py
tests it)."""


def context(run_dir: Path, served_model: Path, url: str | None, check_id: str = "perf.serving.t") -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=run_dir,
                        model=ModelSpec(name=str(served_model), precision="fp32"), check_id=check_id,
                        endpoint={"url": url, "model": None, "reference": True} if url else None)


def check(ctx: CheckContext, **params: Any) -> Outcome:
    try:
        return ServingCheck().run(ctx, ServingParams(framework="endpoint", **params))
    finally:
        release(ctx)


@pytest.fixture(scope="module")
def passed(vllm_server: ManagedServer, served_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Outcome, Path]]:
    run_dir = tmp_path_factory.mktemp("serving-run")
    ctx = context(run_dir, served_model, vllm_server.base_url)
    yield check(ctx, scenario="concurrent_short", levels=[1, 2], max_cv=5.0, warmup_requests=2,
                slo={"ttft_ms": 10_000, "tpot_ms": 10_000}, **TINY), run_dir


def test_the_outcome_has_the_contract_shape(passed: tuple[Outcome, Path]) -> None:
    outcome, _ = passed
    assert outcome.status == Status.PASS, outcome.message
    d = outcome.details
    assert {"scenario", "server", "levels", "records_file", "client", "server_memory"} <= set(d)
    assert d["scenario"] == {"name": "concurrent_short", "arrival": "concurrency", "levels": [1, 2],
                             "input_tokens": 24, "output_tokens": 6, "mixed": None, "num_requests": 4,
                             "duration_s": None, "warmup_requests": 2, "warmup_requests_by_level": {"1": 2, "2": 2},
                             "min_runs": 2, "max_runs": 2,
                             "max_cv": 5.0, "confidence": 0.95, "budget_s": 120.0, "max_drift": 0.2,
                             "max_disturbed_runs": 3, "host": {"max_other_cores": 1000.0, "max_steal_fraction": 0.05},
                             "slo": {"ttft_ms": 10_000, "tpot_ms": 10_000, "e2el_ms": None}}
    assert d["server"]["url"].startswith("http://127.0.0.1:")
    assert [lv["level"] for lv in d["levels"]] == [1, 2]
    for lv in d["levels"]:
        assert set(lv) == {"level", "runs", "median", "spread", "distributions", "stability", "drift"}
        assert len(lv["runs"]) == 2 and all(list(run) == [*RUN_SUMMARY_KEYS, "disturbed", "host"]
                                            for run in lv["runs"])
        assert lv["stability"]["runs"] == 2 and lv["stability"]["stop"] in ("stable", "max_runs")
        assert set(lv["stability"]["metrics"]) == {"ttft_ms_median", "tpot_ms_median", "output_tok_per_s"}
        assert set(lv["drift"]) == {"ttft_ms", "tpot_ms"}
        assert list(lv["median"]) == RUN_SUMMARY_KEYS
        assert set(lv["spread"]) == {"ttft_ms_median", "tpot_ms_median", "output_tok_per_s"}
        assert all(isinstance(v, float) for v in lv["spread"].values())
        assert all(len(q) == 21 for q in lv["distributions"].values())
        for run in lv["runs"]:
            assert (run["completed"], run["failed"], run["total_output_tokens"]) == (4, 0, 24)
            assert run["goodput"] > 0 and run["slo_attainment"] == 1.0
    assert set(d["client"]) == {"cpu_percent", "overhead_us_per_token", "loop_lag_ms_p99", "bottleneck", "warning"}
    assert d["client"]["cpu_percent"] > 0 and d["client"]["overhead_us_per_token"] > 0
    mem = d["server_memory"]
    assert mem["rss_mib_before"] > 100 and mem["rss_mib_after"] > 100  # the vLLM tree, found by its port
    assert mem["kv_cache_usage"] is not None and 0 <= mem["kv_cache_usage"] <= 1
    assert d["workload"]["short_outputs"] == 0 and d["workload"]["input_length_off"] == 0
    assert outcome.metrics["output_tok_per_s"] > 0 and outcome.metrics["level1_output_tok_per_s"] > 0
    assert "concurrency 2" in outcome.message


def test_records_are_written_beside_the_results(passed: tuple[Outcome, Path]) -> None:
    outcome, run_dir = passed
    assert outcome.details["records_file"] == "perf/serving/concurrent_short.jsonl"
    lines = [json.loads(x) for x in (run_dir / outcome.details["records_file"]).read_text().splitlines()]
    assert len(lines) == 2 * 2 * (2 + 4)  # levels x repeats x (warm-up + measured)
    assert sum(1 for x in lines if x["warmup"]) == 8
    assert {(x["level"], x["run"]) for x in lines} == {(1, 0), (1, 1), (2, 0), (2, 1)}
    assert all(x["error"] is None and x["output_tokens"] == 6 and x["input_tokens"] == 24 for x in lines)


def test_a_significant_run_to_run_cv_fails(vllm_server: ManagedServer, served_model: Path, tmp_path: Path) -> None:
    outcome = check(context(tmp_path, served_model, vllm_server.base_url), scenario="tight", levels=[2],
                    max_cv=1e-9, **TINY)
    assert outcome.status == Status.FAIL
    assert "level 2: run-to-run CV of" in outcome.message and "> bound 0%" in outcome.message, outcome.message


def test_errors_over_the_bound_fail(vllm_server: ManagedServer, served_model: Path, tmp_path: Path) -> None:
    with fault_proxy(vllm_server.base_url, "fail_every", every=4) as (url, state):
        outcome = check(context(tmp_path, served_model, url), scenario="flaky", levels=[2], max_cv=5.0,
                        max_error_rate=0.1, **TINY)
    assert state.failed > 0 and outcome.status == Status.FAIL
    assert "error rate" in outcome.message and "injected failure" in outcome.message, outcome.message
    assert sum(run["failed"] for run in outcome.details["levels"][0]["runs"]) > 0


def test_a_server_dying_mid_scenario_stops_it_promptly(vllm_server: ManagedServer, served_model: Path,
                                                      tmp_path: Path) -> None:
    import time

    with fault_proxy(vllm_server.base_url, "dies", after=12) as (url, _):
        start = time.perf_counter()
        outcome = check(context(tmp_path, served_model, url), scenario="dying", levels=[2], max_cv=5.0,
                        input_tokens=24, output_tokens=6, num_requests=8, min_runs=3, max_runs=3,
                        host={"max_other_cores": 1000.0})
        wall = time.perf_counter() - start
    assert wall < 30 and outcome.status in (Status.FAIL, Status.ERROR)
    assert "stopped at level 2" in outcome.message or "nothing measured" in outcome.message, outcome.message
    assert "accepting connections" in outcome.message or "closed" in outcome.message


def test_no_server_is_a_not_applicable_skip(served_model: Path, tmp_path: Path) -> None:
    outcome = check(context(tmp_path, served_model, None), scenario="none", **TINY)
    assert outcome.status == Status.SKIP and outcome.applicable is False and "--endpoint" in outcome.message
    in_process = ServingCheck().run(context(tmp_path, served_model, None),
                                    ServingParams(framework="transformers", scenario="none", **TINY))
    assert in_process.status == Status.SKIP and in_process.applicable is False
    assert "serves no HTTP endpoint" in in_process.message


@pytest.mark.parametrize(("params", "error"), [
    ({"scenario": "x", "bogus": 1}, "Extra inputs"),
    ({"scenario": "x", "mixed": [{"input_tokens": 8, "output_tokens": 4}], "input_tokens": 8}, "not both"),
    ({"scenario": "x", "num_requests": 4, "duration_s": 5}, "not both"),
    ({"scenario": "x", "arrival": "burst", "levels": [8], "num_requests": 8}, "burst"),
    ({"scenario": "x", "levels": [1.5]}, "whole numbers"),
    ({"scenario": "x", "min_runs": 1}, "greater than or equal to 2"),
    ({"scenario": "bad/name"}, "pattern"),
    ({"scenario": "x", "slo": {"ttft": 5}}, "Extra inputs"),
])
def test_params_are_strict(params: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        ServingParams(**params)


def test_params_defaults() -> None:
    p = ServingParams(scenario="x")
    assert (p.framework, p.arrival, p.levels, p.input_tokens, p.output_tokens, p.num_requests) == \
        ("auto", "concurrency", [1], 128, 64, 32)
    assert p.warmups() == 2 and ServingParams(scenario="x", levels=[4, 32]).warmups() == 16
    # Per level: one warm-up per in-flight slot of that level (2 to 16), not the most of all levels.
    wide = ServingParams(scenario="x", levels=[1, 4, 32])
    assert [wide.run_config(lv, 0).warmup_requests for lv in (1, 4, 32)] == [2, 4, 16]
    assert ServingParams(scenario="x", levels=[1, 4], warmup_requests=1).run_config(4, 0).warmup_requests == 1
    burst = ServingParams(scenario="x", arrival="burst", levels=[8]).run_config(8, 0)
    assert (burst.num_requests, burst.slots) == (8, 8)
    poisson = ServingParams(scenario="x", arrival="poisson", levels=[0.5], duration_s=10).run_config(0.5, 0)
    assert poisson.num_requests is None and poisson.deadline_s() == 10 + 60


def test_auto_picks_the_endpoint_when_given_else_the_first_installed_server(
        tmp_path: Path, served_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_endpoint = context(tmp_path, served_model, "http://127.0.0.1:9/v1")
    assert resolve_framework(with_endpoint, "auto") == "endpoint"
    assert resolve_framework(with_endpoint, "vllm_serve") == "vllm_serve"  # named: taken as given
    bare = context(tmp_path, served_model, None)
    monkeypatch.setattr(VllmServeFramework, "availability", classmethod(lambda cls: Availability(True)))
    assert resolve_framework(bare, "auto") == "vllm_serve"
    monkeypatch.setattr(VllmServeFramework, "availability", classmethod(lambda cls: Availability(False, "no vllm")))
    assert resolve_framework(bare, "auto") == "transformers_serve"
    monkeypatch.setattr(TransformersServeFramework, "availability",
                        classmethod(lambda cls: Availability(False, "no fastapi")))
    # Nothing installed: the first choice, whose skip then names what to install.
    assert resolve_framework(bare, "auto") == "vllm_serve"


def test_registered_and_run_by_the_cli(vllm_server: ManagedServer, served_model: Path,
                                       write_ladder: Callable[..., Path], tmp_path: Path) -> None:
    ladder = write_ladder([{"id": "perf.serving.single_short", "step": 5, "kind": "perf.serving",
                            "params": {"framework": "endpoint", "scenario": "single_short",
                                       # What this test asks is that the CLI runs the check, not how
                                       # stable a loaded CI machine is: 6-token answers read late by a
                                       # busy client arrive in one piece (TPOT ≈ 0 in one run, seen in CI).
                                       **TINY, "output_tokens": 16, "max_cv": 1e6, "max_drift": 1e6}}],
                          timeout_s=300)
    out = tmp_path / "run"
    proc = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(out), "--quiet",
                    "--endpoint", vllm_server.base_url, "--model", str(served_model)], timeout=600)
    results = json.loads((out / "results.json").read_text())
    (result,) = [c for c in results["checks"] if c["id"] == "perf.serving.single_short"]
    assert result["status"] == "pass", (result["message"], proc.stderr[-2000:])
    assert (out / result["details"]["records_file"]).is_file()
