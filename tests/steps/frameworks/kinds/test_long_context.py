"""``framework.long_context``: the pure rules (fast), and one small ladder through the real CLI
(slow): healthy vLLM passes every row (near-limit vs float64, over-length refused, chunked vs
one-step prefill with the scheduler's chunks), the planted chunk-position defect fails."""

from __future__ import annotations

import json
from typing import Any

import pytest

from adaptcheck.openai_client.errors import EndpointStatusError
from adaptcheck.steps.frameworks.kinds.long_context import (
    expected_chunks,
    judge_chunks,
    judge_refusal,
    near_limit_tokens,
)
from tests.conftest import run_checks

PLANTED = "tests.steps.frameworks.planted_pressure:ChunkPositionsRestart"
SMALL = {"compile": False, "max_model_len": 512, "chunk_tokens": 128, "max_tokens": 8,
         "teacher": {"prompts": 2, "long_prompt_tokens": 0, "chat": False, "max_tokens": 8}}


# ---- fast: the rules ----------------------------------------------------------------------

def test_near_limit_prompt_leaves_room_for_the_answer() -> None:
    assert near_limit_tokens(2048, 16, 8) == 2024
    with pytest.raises(ValueError, match="no room"):
        near_limit_tokens(20, 16, 8)


def test_expected_chunks() -> None:
    assert expected_chunks(2024, 256) == 8 and expected_chunks(256, 256) == 1


def test_chunks_judged_from_the_scheduler() -> None:
    assert judge_chunks([256] * 7 + [232], 2024, 256)[0] is True
    ok, why = judge_chunks([2024], 2024, 256)
    assert ok is False and "not chunked" in why
    ok, why = judge_chunks([300, 300], 600, 256)
    assert ok is False and "budget" in why
    ok, why = judge_chunks([256, 100], 600, 256)
    assert ok is False and "not the prompt's 600" in why
    assert judge_chunks(None, 600, 256)[0] is None


def test_refusals_in_process() -> None:
    assert judge_refusal(ValueError("prompt too long"), served=False)[0] is True

    class VLLMClientError(Exception):
        pass

    class VLLMValidationError(VLLMClientError):
        pass

    assert judge_refusal(VLLMValidationError("too long"), served=False)[0] is True
    ok, why = judge_refusal(RuntimeError("CUDA error"), served=False)
    assert ok is False and "RuntimeError" in why
    ok, why = judge_refusal(None, served=False)
    assert ok is False and "answered" in why


def test_refusals_served() -> None:
    bad_request = EndpointStatusError("x answered HTTP 400: too long", status=400, server_message="too long")
    assert judge_refusal(bad_request, served=True) == (True, "HTTP 400: too long")
    crash = EndpointStatusError("x answered HTTP 500: boom", status=500, server_message="boom")
    assert judge_refusal(crash, served=True)[0] is False
    silent = EndpointStatusError("x answered HTTP 400", status=400, server_message="")
    assert judge_refusal(silent, served=True)[0] is False


# ---- slow: one ladder through the real CLI -----------------------------------------------

@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    return run_checks(tmp_path_factory.mktemp("long_context"), [
        {"id": "healthy", "step": 4, "kind": "framework.long_context", "params": {"framework": "vllm", **SMALL}},
        {"id": "planted", "step": 4, "kind": "framework.long_context",
         "params": {"framework": PLANTED, **json.loads(json.dumps(SMALL))}},
    ])


@pytest.mark.slow
def test_healthy_vllm_passes_every_long_context_row(checks: dict[str, dict[str, Any]]) -> None:
    c = checks["healthy"]
    assert c["status"] == "pass", c["message"]
    rows = {r["name"]: r for r in c["details"]["subchecks"]}
    assert rows["near-limit prompt vs float64 reference"]["ok"] is True
    assert rows["prompt distributions: one-step vs chunked prefill"]["ok"] is True
    assert "496-token prompt of a 512-token context" in rows["near-limit prompt vs float64 reference"]["detail"]
    assert rows["over-length request refused"]["ok"] is True
    assert "maximum context length" in rows["over-length request refused"]["detail"]
    assert rows["serves the next request"]["ok"] is True
    assert c["metrics"]["prefill_chunks"] == 4 and c["metrics"]["max_num_batched_tokens"] == 128
    proof = c["details"]["feature"]
    assert proof["feature"] == "chunked_prefill" and proof["active"] is True
    assert proof["engine"]["enable_chunked_prefill"] is True


@pytest.mark.slow
def test_chunk_positions_restarting_fails_the_chunked_rows(checks: dict[str, dict[str, Any]]) -> None:
    c = checks["planted"]
    assert c["status"] == "fail", c["message"]
    rows = {r["name"]: r["ok"] for r in c["details"]["subchecks"]}
    assert rows["feature active: chunked prefill"] is True  # it did chunk: the answers are what fail
    # The prompt's own ~500 positions see the defect directly (the 8 answer tokens only through the cache).
    assert rows["prompt distributions: one-step vs chunked prefill"] is False
    assert rows["over-length request refused"] is True


def test_a_framework_without_chunked_prefill_settings_is_not_applicable() -> None:
    from adaptcheck.steps.frameworks.kinds.long_context import LongContextCheck, LongContextParams

    outcome = LongContextCheck().run(None, LongContextParams(framework="transformers"))  # type: ignore[arg-type]
    assert outcome.status == "skip" and outcome.applicable is False
    assert "chunked-prefill settings" in outcome.message


class _Engine:
    """An engine that answers and reports the given facts (no scheduler in this process)."""

    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts

    def engine_facts(self) -> dict[str, Any]:
        return self.facts

    def generate(self, requests: list[Any]) -> list[Any]:
        return []


def _proof(facts: dict[str, Any], plain: dict[str, Any] | None = None) -> Any:
    from types import SimpleNamespace

    from adaptcheck.steps.frameworks.kinds.long_context import LongContextParams, _prove

    seen = {"plain": plain or {"max_num_batched_tokens": 4096, "enable_chunked_prefill": True},
            "prompt_tokens": 496, "first_ids": list(range(496))}
    active = SimpleNamespace(framework=_Engine(facts))
    return _prove(active, {}, LongContextParams(framework="vllm", chunk_tokens=128), seen)  # type: ignore[arg-type]


def test_chunk_proof_from_the_resolved_settings_alone() -> None:
    proof = _proof({"enable_chunked_prefill": True, "max_num_batched_tokens": 128})
    assert proof.rows[0].ok is True and proof.record.active is True


def test_a_budget_that_holds_the_prompt_is_no_chunking() -> None:
    proof = _proof({"enable_chunked_prefill": True, "max_num_batched_tokens": 4096})
    assert proof.rows[0].ok is False and "nothing to chunk" in proof.rows[0].detail


def test_both_sides_chunking_compares_nothing() -> None:
    proof = _proof({"enable_chunked_prefill": True, "max_num_batched_tokens": 128},
                   plain={"enable_chunked_prefill": True, "max_num_batched_tokens": 256})
    assert proof.rows[0].ok is False and "both sides chunk" in proof.rows[0].detail


def test_nothing_read_back_is_not_a_proof() -> None:
    proof = _proof({})
    assert proof.rows[0].ok is None and "not observable" in proof.rows[0].detail
