"""grouped_topk and fused_moe_shared (DeepSeek's routing and shared experts): correct routers and
layers pass over seeds, each planted defect fails, in the torch path and around vLLM's own code."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.catalog import get_op
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families.moe import MoeSharedCase
from adaptcheck.steps.ops.families.moe_routing import GroupedTopkCase
from adaptcheck.steps.ops.providers.base import DictProvider, OpProvider
from tests.steps.ops import planted_moe as pm

V3: dict[str, Any] = {"name": "v3_like", "tokens": 16, "experts": 64, "topk": 8, "n_group": 8, "topk_group": 4,
      "routed_scaling_factor": 2.5}
ROUTING: list[dict[str, Any]] = [
    V3,
    {"name": "v2_like", "tokens": 16, "experts": 64, "topk": 6, "n_group": 8, "topk_group": 3, "scoring": "softmax",
     "correction_bias": False, "renormalize": False, "routed_scaling_factor": 16.0},
    {"name": "v3_full_decode", "tokens": 1, "experts": 256, "topk": 8, "n_group": 8, "topk_group": 4,
     "routed_scaling_factor": 2.5},
    {"name": "one_group", "tokens": 8, "experts": 16, "topk": 4, "n_group": 1, "topk_group": 1},
]
SHARED: list[dict[str, Any]] = [
    {"name": "v3_like", "tokens": 16, "hidden": 64, "intermediate": 32, "experts": 8, "topk": 2,
     "routed_scaling_factor": 2.5},
    {"name": "hot_expert_2_shared", "tokens": 16, "hidden": 64, "intermediate": 48, "experts": 8, "topk": 2,
     "n_shared": 2, "same_expert": True},
]
ALL_DTYPES = ["fp32", "bf16", "fp16"]


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def run_op(provider: OpProvider, op: str, cases: Sequence[Mapping[str, object]], dtypes: list[str],
           seed: int = 0) -> dict[str, Status]:
    params = OpCheckParams(op=op, provider=provider.name, dtypes=dtypes, cases=list(cases), budget_s=120)
    return {str(o.subid): o.status for o in OpCheck(provider).run(_ctx(seed), params)}


def _one(op: str, fn: Callable[..., Any]) -> DictProvider:
    return DictProvider("under_test", {op: fn})


@pytest.mark.parametrize("seed", range(5))
def test_torch_provider_and_a_token_loop_router_pass_across_seeds(seed: int) -> None:
    passing = dict.fromkeys(ALL_DTYPES, Status.PASS)
    assert run_op(_one("grouped_topk", get_op("grouped_topk").native), "grouped_topk", ROUTING, ALL_DTYPES, seed) == passing
    assert run_op(_one("grouped_topk", pm.token_loop_router), "grouped_topk", ROUTING, ALL_DTYPES, seed) == passing
    assert run_op(_one("grouped_topk", pm.torch_router()), "grouped_topk", ROUTING, ALL_DTYPES, seed) == passing
    fn = get_op("fused_moe_shared").native
    assert run_op(_one("fused_moe_shared", fn), "fused_moe_shared", SHARED, ALL_DTYPES, seed) == passing


@pytest.mark.parametrize("defect", pm.ROUTING_DEFECTS)
def test_routing_defects_are_caught(defect: str) -> None:
    got = run_op(_one("grouped_topk", pm.torch_router(defect)), "grouped_topk", [V3], ["fp32", "bf16"])
    assert got == {"fp32": Status.FAIL, "bf16": Status.FAIL}, defect


@pytest.mark.parametrize("defect", pm.SHARED_DEFECTS)
def test_shared_expert_defects_are_caught(defect: str) -> None:
    got = run_op(_one("fused_moe_shared", pm.torch_shared(defect)), "fused_moe_shared", SHARED[:1], ALL_DTYPES)
    assert got == dict.fromkeys(ALL_DTYPES, Status.FAIL), defect


@pytest.mark.parametrize("seed", range(5))
def test_inputs_keep_clear_gaps_and_the_bias_and_groups_decide(seed: int) -> None:
    op = get_op("grouped_topk")
    for case, dtype in [(V3, "bf16"), (ROUTING[1], "fp16"), (ROUTING[2], "bf16")]:
        notes: dict[str, Any] = dict(op.make_inputs(GroupedTopkCase.model_validate(case), dtype,
                                                    torch.Generator().manual_seed(seed)).notes)
        floor = 0.05 if notes["gap_domain"] == "score + bias" else 0.25
        assert notes["min_group_gap"] >= floor and notes["min_cut_gap"] >= floor, (case["name"], notes)
        # Most tokens would be routed elsewhere without the group stage or the bias.
        assert notes["tokens_groups_decide"] >= case["tokens"] // 2, notes
        if case.get("correction_bias", True):
            assert notes["tokens_bias_decides"] >= case["tokens"] // 2, notes


@pytest.mark.parametrize(("fields", "why"), [
    ({"experts": 60}, "not divisible"),
    ({"topk_group": 9}, "topk_group"),
    ({"topk": 3}, "topk 3 outside"),
    ({"scoring": "softmax"}, "needs sigmoid"),
])
def test_case_model_refuses_shapes_the_routing_cannot_have(fields: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        GroupedTopkCase.model_validate({**V3, **fields})


def test_shrunk_shared_cases_keep_model_widths() -> None:
    # A slow device shrinks cases; a shared width off a multiple of 32 would trip vLLM's
    # silu_and_mul (d % vector length), which no real model meets.
    case = MoeSharedCase.model_validate({**SHARED[0], "tokens": 1, "intermediate": 128})
    assert [case.scaled(f).intermediate for f in (1.0, 0.5, 0.01)] == [128, 64, 32]
    assert case.scaled(0.01).experts == case.experts


# ------------------------------------------------------------------------- through vLLM


@pytest.fixture(scope="module")
def vllm_provider() -> OpProvider:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider

    provider = VllmProvider()
    ok, reason = provider.available()
    if not ok:
        pytest.skip(reason)
    return provider


@pytest.mark.parametrize("seed", range(2))
def test_vllm_router_and_shared_experts_pass(vllm_provider: OpProvider, seed: int) -> None:
    # vLLM's CPU MoE kernel needs hidden % 32 == 0 (true of SHARED).
    passing = dict.fromkeys(ALL_DTYPES, Status.PASS)
    assert run_op(vllm_provider, "grouped_topk", ROUTING, ALL_DTYPES, seed) == passing
    assert run_op(vllm_provider, "fused_moe_shared", SHARED, ALL_DTYPES, seed) == passing


def test_defects_wired_around_vllm_are_caught(vllm_provider: OpProvider) -> None:
    for defect in pm.ROUTING_DEFECTS:
        got = run_op(_one("grouped_topk", pm.vllm_router(defect)), "grouped_topk", [V3], ["fp32", "bf16"])
        assert got == {"fp32": Status.FAIL, "bf16": Status.FAIL}, defect
    for defect in pm.SHARED_DEFECTS:
        got = run_op(_one("fused_moe_shared", pm.vllm_shared(defect)), "fused_moe_shared", SHARED[:1], ["fp32", "bf16"])
        assert got == {"fp32": Status.FAIL, "bf16": Status.FAIL}, defect
