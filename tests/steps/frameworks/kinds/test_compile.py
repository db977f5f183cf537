"""framework.compile: the activity proof's rules (fast), and one real CPU run (slow) where the
healthy compiled engine passes and both planted defects fail on the row that names them
(tests/steps/frameworks/planted_ctp.py; docs/features.md, "Graph capture / compile")."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import JsonValue, ValidationError

from adaptcheck.steps.frameworks.kinds.compile import CompileParams, _prove
from adaptcheck.steps.frameworks.lifecycle import Active
from tests.conftest import run_checks
from tests.steps.frameworks.planted_ctp import compile_checks

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
CPU_FACTS: dict[str, JsonValue] = {"compilation_mode": "DYNAMO_TRACE_ONCE", "cudagraph_mode": "NONE",
                                   "cudagraph_capture_sizes": [], "compiled_modules": ["model:LlamaModel"]}


def fake(facts: dict[str, JsonValue], log: Path | None = None) -> Active:
    fw = SimpleNamespace(engine_facts=lambda: facts,
                         describe=lambda: {"server_log": str(log)} if log is not None else {})
    return cast(Active, SimpleNamespace(framework=fw))


def row(active: Active, batches: list[int] | None = None) -> tuple[bool | None, str]:
    proof = _prove(active, batches or [3, 5])
    assert proof.rows[0].name == "feature active: compile" and proof.record.feature == "graph_capture"
    return proof.rows[0].ok, proof.rows[0].detail


def test_cpu_inductor_path_is_active() -> None:
    ok, how = row(fake(CPU_FACTS))
    assert ok is True and "DYNAMO_TRACE_ONCE" in how and "LlamaModel" in how and "captures none" in how


@pytest.mark.parametrize(("change", "why"), [
    ({"compilation_mode": "NONE"}, "runs eager"),
    ({"compiled_modules": []}, "no module was compiled"),
    ({"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": []}, "no batch size was captured"),
])
def test_nothing_compiled_or_captured_fails(change: dict[str, JsonValue], why: str) -> None:
    ok, how = row(fake({**CPU_FACTS, **change}))
    assert ok is False and why in how


def test_captured_sizes_name_the_padded_batches() -> None:
    ok, how = row(fake({**CPU_FACTS, "compilation_mode": "VLLM_COMPILE", "cudagraph_mode": "FULL_AND_PIECEWISE",
                        "cudagraph_capture_sizes": [1, 2, 4, 8, 16]}))
    assert ok is True and "3 (padded to 4)" in how and "5 (padded to 8)" in how


def test_served_engine_is_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    cfg = ("Initializing a V1 LLM engine with config: compilation_config={'mode': <CompilationMode.{m}: 2>, "
           "'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagraph_capture_sizes': []}\n")
    log.write_text(cfg.replace("{m}", "DYNAMO_TRACE_ONCE") + "[backbone] saved AOT compiled function to /x\n")
    assert row(fake({}, log))[0] is True
    log.write_text(cfg.replace("{m}", "NONE"))
    assert row(fake({}, log))[0] is False
    log.write_text("nothing about the engine\n")
    ok, how = row(fake({}, log))
    assert ok is None and "not read back" in how
    assert row(fake({}))[0] is None  # no config read back, no log: unknown, never a pass


def test_batch_sizes_must_fit_the_prompts() -> None:
    with pytest.raises(ValidationError, match=r"each must be 2\.\.prompts"):
        CompileParams(framework="vllm", prompts=4, batch_sizes=[3, 5])


@pytest.fixture(scope="module")
def compile_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return run_checks(tmp_path_factory.mktemp("compile"), compile_checks(),  # type: ignore[arg-type]
                      check_timeout_s=900, timeout=1800)


def rows(check: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in check["details"]["subchecks"]}


@pytest.mark.slow
@needs_vllm
def test_healthy_compile_passes_with_its_proof(compile_run: dict[str, dict[str, Any]]) -> None:
    check = compile_run["compile.healthy"]
    assert check["status"] == "pass", check["message"]
    feature = check["details"]["feature"]
    assert feature["active"] is True and feature["engine"]["compilation_mode"] != "NONE"
    assert feature["engine"]["compiled_modules"], feature
    # On the CPU vLLM captures no graphs: the inductor path is what ran.
    assert feature["engine"]["cudagraph_capture_sizes"] == []
    assert rows(check)["greedy tokens: compile off vs compile on"]["ok"] is True


@pytest.mark.slow
@needs_vllm
def test_eager_under_compile_fails_the_activity_row(compile_run: dict[str, dict[str, Any]]) -> None:
    check = compile_run["compile.eager"]
    assert check["status"] == "fail" and check["message"].startswith("feature active: compile")
    assert "runs eager" in rows(check)["feature active: compile"]["detail"]


@pytest.mark.slow
@needs_vllm
def test_compiled_path_wrong_at_padded_sizes_fails(compile_run: dict[str, dict[str, Any]]) -> None:
    check = compile_run["compile.padded"]
    got = rows(check)
    assert check["status"] == "fail", check["message"]
    assert got["feature active: compile"]["ok"] is True  # it did compile; its answers are what is wrong
    assert got["distributions: compile off vs compile on"]["ok"] is False
