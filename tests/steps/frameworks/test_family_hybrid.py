"""The hybrid family at step 4 (docs/families.md): ``embedded:tiny-hybrid``'s layout and
state-space initialisation, the planted Mamba2 kernels and vLLM's prefix-caching rule without
a model (fast), and one small ladder through the real CLI (slow): the healthy transformers and
vLLM reference checks pass, the Mamba state not carried between decode steps and the dropped D
skip each fail.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import pytest
import torch
from pydantic import JsonValue

from adaptcheck.frameworks.synthetic import EMBEDDED
from adaptcheck.frameworks.synthetic_families import hybrid
from adaptcheck.steps.frameworks.kinds.kv_cache import state_prefix_caching
from tests.conftest import run_checks
from tests.steps.frameworks import planted_hybrid

SPEC = EMBEDDED["tiny-hybrid"]


# ------------------------------------------------------------------------- fast: the model --

def test_tiny_hybrid_mixes_mamba2_and_attention_layers() -> None:
    names = {name for name, _, _ in hybrid._layout(SPEC)}
    kinds = list(SPEC.knob("layer_types"))
    assert "mamba" in kinds and "attention" in kinds and len(kinds) == SPEC.num_layers
    for i, kind in enumerate(kinds):
        assert (f"model.layers.{i}.mamba.A_log" in names) == (kind == "mamba")
        assert (f"model.layers.{i}.self_attn.q_proj.weight" in names) == (kind == "attention")


def test_mamba_projection_shapes_follow_the_knobs() -> None:
    shapes = {name: shape for name, shape, _ in hybrid._layout(SPEC)}
    d_inner, d_state, heads = 2 * SPEC.hidden_size, SPEC.knob("mamba_d_state"), SPEC.knob("mamba_n_heads")
    assert heads * SPEC.knob("mamba_d_head") == d_inner
    assert shapes["model.layers.0.mamba.in_proj.weight"] == (2 * d_inner + 2 * d_state + heads, SPEC.hidden_size)
    assert shapes["model.layers.0.mamba.conv1d.weight"] == (d_inner + 2 * d_state, 1, SPEC.knob("mamba_d_conv"))


def test_state_space_parameters_are_drawn_like_real_checkpoints() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.exp(hybrid._init("A_log", (512,), "a_log", gen))  # type: ignore[arg-type]
    dt = torch.nn.functional.softplus(hybrid._init("dt_bias", (512,), "dt_bias", gen).double())  # type: ignore[union-attr]
    assert 1.0 <= float(a.min()) and float(a.max()) <= 16.0 and float(a.max()) > 8
    assert 1e-3 * (1 - 1e-4) <= float(dt.min()) and float(dt.max()) <= 1e-1 * (1 + 1e-4)
    assert math.log10(float(dt.max()) / float(dt.min())) > 1.5  # log-uniform: spans the decades
    assert hybrid._init("x", (3,), "linear", gen) is None  # the standard kinds are the generator's


# ----------------------------------------------------------------- fast: the planted kernels --

def test_the_dropped_d_reaches_the_kernel_by_position_and_by_keyword() -> None:
    def kernel(state: Any, x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None) -> Any:
        return D

    faulty = planted_hybrid._no_d(kernel)
    assert faulty(0, 1, 2, 3, 4, 5, "d") is None
    assert faulty(0, 1, 2, 3, 4, 5, D="d", z=1) is None


def test_the_state_not_carried_starts_each_update_from_zero() -> None:
    seen: list[float] = []
    faulty = planted_hybrid._fresh_state(lambda state, *a, **k: seen.append(float(state.sum())))
    faulty(torch.ones(2, 3))
    assert seen == [0.0]


# ------------------------------------------------------------- fast: vLLM's prefix caching --

def test_prefix_shorter_than_a_mamba_block_is_not_applicable_with_vllms_mode() -> None:
    facts: dict[str, JsonValue] = {"has_inner_state": True, "mamba_cache_mode": "align", "mamba_block_size": 128}
    said = state_prefix_caching(facts, 64)
    assert said is not None
    ok, why = said
    assert ok is None and "whole block of 128 tokens (mamba_cache_mode 'align')" in why and "shorter" in why
    assert state_prefix_caching(facts, 256) == (True, "vLLM caches this model's Mamba state per whole block of 128 "
                                                      "tokens (mamba_cache_mode 'align')")
    assert state_prefix_caching({**facts, "mamba_cache_mode": "none"}, 256) == (
        None, "vLLM does not cache the Mamba state of a prefix for this model (mamba_cache_mode 'none')")
    assert state_prefix_caching({"has_inner_state": False, "mamba_cache_mode": "none"}, 64) is None
    assert state_prefix_caching({}, 64) is None


# ------------------------------------------------------------------- slow: one ladder, real CLI --

SMALL = {"prompts": 3, "long_prompt_tokens": 0, "chat": False, "max_tokens": 16}
"""One float64 teacher for every check (no long prompt: the float64 torch scan is the cost)."""
PLANTED = {"state": "tests.steps.frameworks.planted_hybrid:SsmStateNotCarried",
           "no_d": "tests.steps.frameworks.planted_hybrid:SsmNoDSkip"}


def ref_check(id_: str, framework: str, **params: Any) -> dict[str, Any]:
    return {"id": id_, "step": 4, "kind": "framework.reference",
            "params": {"framework": framework, "model": "embedded:tiny-hybrid", **SMALL, **params}}


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One run: the healthy reference on transformers and vLLM, and the two planted defects."""
    # transformers in fp32: its bf16 depthwise conv1d is the slowest kernel of the run on a
    # CPU (~1000x the fp32 one under load), and each planted defect is far beyond any dtype's bound.
    checks = [ref_check("hy.transformers", "transformers", dtype="fp32"),
              ref_check("hy.state", PLANTED["state"], dtype="fp32"), ref_check("hy.no_d", PLANTED["no_d"], dtype="fp32")]
    if importlib.util.find_spec("vllm") is not None:
        checks.insert(1, ref_check("hy.vllm", "vllm", compile=False))
    return run_checks(tmp_path_factory.mktemp("hybrid"), checks, timeout=1800)


def rows(check: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in check["details"]["subchecks"]}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the module's one CLI run is set up by the first test that reads it
@pytest.mark.parametrize("check_id", ["hy.transformers", "hy.vllm"])
def test_the_healthy_hybrid_agrees_with_float64(hybrid_run: dict[str, dict[str, Any]], check_id: str) -> None:
    if check_id not in hybrid_run:
        pytest.skip("vLLM is not installed")
    c = hybrid_run[check_id]
    assert c["status"] == "pass", c["message"]
    assert c["metrics"]["reference_dtype"] == "fp64" and c["metrics"]["sequences_failed"] == 0
    assert c["metrics"]["tf_kl_mean"] < 4 * c["metrics"]["control_kl_mean"] + 1e-3


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_state_not_carried_fails_the_cached_greedy_decode(hybrid_run: dict[str, dict[str, Any]]) -> None:
    c = hybrid_run["hy.state"]
    assert c["status"] == "fail"
    # Scoring is one forward pass with no state cache, so only the decode shows it.
    assert rows(c)["teacher-forced distributions vs float64 reference"]["ok"] is True
    assert rows(c)["greedy tokens vs CPU reference"]["ok"] is False


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_dropped_d_skip_fails_the_distributions(hybrid_run: dict[str, dict[str, Any]]) -> None:
    c = hybrid_run["hy.no_d"]
    assert c["status"] == "fail"
    assert rows(c)["teacher-forced distributions vs float64 reference"]["ok"] is False
