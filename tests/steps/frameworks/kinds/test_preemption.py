"""``framework.preemption``: the pure sizing logic (fast), and one small ladder through the real
CLI (slow): the healthy vLLM passes with preemptions counted, the planted stale-block resume fails."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from adaptcheck.steps.frameworks.kinds.preemption import (
    PreemptionParams,
    batch_tokens,
    cache_tokens,
    preemptions,
    pressure_problem,
)
from tests.conftest import run_checks

PLANTED = "tests.steps.frameworks.planted_pressure:PreemptStaleBlocks"
SMALL = {"compile": False, "teacher": {"prompts": 2, "long_prompt_tokens": 0, "chat": False, "max_tokens": 8}}
"""The kind's default pressure (8 requests of 96 tokens against 10 blocks of 32: ~10 preemptions
on tiny-llama); a smaller batch preempts only two or three times, too few for the stale-block
resume to show on every seed, and the engine loads dominate the time anyway."""


# ---- fast: the sizing rules ---------------------------------------------------------------

def test_cache_and_batch_sizes() -> None:
    assert cache_tokens(10, 32) == 320
    assert batch_tokens(8, 96, prompt_tokens=10) == 848


def test_a_cache_too_small_for_one_request_is_refused_up_front_with_the_fix() -> None:
    why = pressure_problem(blocks=4, block_size=32, max_model_len=256, prompts=8, max_tokens=96)
    assert why is not None and "kv_blocks" in why and "at least 9" in why


def test_a_batch_that_fits_the_cache_would_never_preempt() -> None:
    why = pressure_problem(blocks=40, block_size=32, max_model_len=256, prompts=2, max_tokens=16)
    assert why is not None and "nothing would be preempted" in why


def test_an_answer_longer_than_the_pressured_context_is_refused() -> None:
    why = pressure_problem(blocks=10, block_size=32, max_model_len=128, prompts=8, max_tokens=120)
    assert why is not None and "max_tokens" in why


def test_the_defaults_and_the_test_sizes_pressure() -> None:
    PreemptionParams(framework="vllm")
    PreemptionParams(framework="vllm", **SMALL)


def test_params_that_cannot_pressure_are_a_ladder_error() -> None:
    with pytest.raises(ValidationError, match="kv_blocks"):
        PreemptionParams(framework="vllm", kv_blocks=2)


def test_preemptions_read_either_counter_name() -> None:
    assert preemptions({"vllm:num_preemptions": 3.0}) == 3.0
    assert preemptions({"vllm:num_preemptions_total": 2.0}) == 2.0
    assert preemptions({"vllm:prompt_tokens": 100.0}) == 0.0


# ---- slow: one ladder through the real CLI -----------------------------------------------

@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    return run_checks(tmp_path_factory.mktemp("preemption"), [
        {"id": "healthy", "step": 4, "kind": "framework.preemption", "params": {"framework": "vllm", **SMALL}},
        {"id": "planted", "step": 4, "kind": "framework.preemption",
         "params": {"framework": PLANTED, **json.loads(json.dumps(SMALL))}},
    ])


@pytest.mark.slow
def test_healthy_vllm_preempts_and_answers_as_unpressured(checks: dict[str, dict[str, Any]]) -> None:
    c = checks["healthy"]
    assert c["status"] == "pass", c["message"]
    assert c["metrics"]["preemptions"] > 0 and c["metrics"]["num_gpu_blocks"] == 10
    proof = c["details"]["feature"]
    assert proof["feature"] == "preemption" and proof["active"] is True
    assert proof["engine"]["num_gpu_blocks"] == 10 and proof["engine"]["block_size"] == 32
    rows = {r["name"]: r["ok"] for r in c["details"]["subchecks"]}
    assert rows["feature active: preemption"] is True
    assert rows["distributions: unpressured vs 10-block cache"] is True


@pytest.mark.slow
def test_resuming_on_stale_blocks_fails_the_check(checks: dict[str, dict[str, Any]]) -> None:
    c = checks["planted"]
    assert c["status"] == "fail", c["message"]
    # Preemption really happened (the defect only bites on resume), and the answers name why.
    assert c["metrics"]["preemptions"] > 0
    assert "unpressured vs 10-block cache" in c["message"]


def test_a_framework_without_kv_cache_settings_is_not_applicable() -> None:
    from adaptcheck.steps.frameworks.kinds.preemption import PreemptionCheck

    check = PreemptionCheck()
    params = PreemptionParams(framework="transformers")
    outcome = check.run(None, params)  # type: ignore[arg-type]  # decided before any context is read
    assert outcome.status == "skip" and outcome.applicable is False
    assert "KV-cache size settings" in outcome.message
