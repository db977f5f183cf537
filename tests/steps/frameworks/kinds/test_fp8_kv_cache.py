"""``framework.fp8_kv_cache``: the fp8 bound, the activity proof and vLLM's refusals without vLLM
(fast), and one small ladder through the real CLI (slow): the healthy fp8 cache passes, the cache
written at the wrong scale fails on its teacher-forced row, head_dim 80 is n/a with vLLM's reason.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any, cast

import pytest
from pydantic import ValidationError

from adaptcheck.base.hostfacts import cpu_flags
from adaptcheck.base.schemas.numerics import Fp8KvCachePolicy, Rule
from adaptcheck.frameworks.base import FrameworkError
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.frameworks import divergence as dv
from adaptcheck.steps.frameworks.bounds import load_numerics
from adaptcheck.steps.frameworks.kinds.fp8_kv_cache import (
    Fp8KvCacheCheck,
    Fp8KvCacheParams,
    fp8_rules,
    fp8_scale,
    judge_activity,
    vllm_refusal,
)
from tests.conftest import run_checks

FP8_HERE = bool({"avx512f", "amx_tile"} & (cpu_flags() or frozenset()))
"""vLLM's CPU_ATTN takes an fp8 cache only with AVX-512 or AMX (else n/a, vLLM's message)."""
PLANTED = "tests.steps.frameworks.planted_fp8:WrongFp8Scale"


def shipped() -> Fp8KvCachePolicy:
    policy = load_numerics().fp8_kv_cache
    assert policy is not None, "tolerances.yaml lacks model_numerics.fp8_kv_cache"
    return policy


# ------------------------------------------------------------------------- fast: the bound --

def test_the_scale_is_the_roundoff_ratio_squared() -> None:
    policy = Fp8KvCachePolicy(kv_share=0.5, reason="a test policy", bounds={})
    assert fp8_scale(policy, "fp8_e4m3", "bf16") == pytest.approx(1 + 0.5 * 16 ** 2)
    assert fp8_scale(policy, "fp8_e5m2", "bf16") == pytest.approx(1 + 0.5 * 32 ** 2)
    # fp16 rounds 8x finer than bf16, so its control is ~64x smaller and the scale 64x larger.
    assert fp8_scale(policy, "fp8_e4m3", "fp16") == pytest.approx(1 + 0.5 * 128 ** 2)
    with pytest.raises(KeyError):
        fp8_scale(policy, "int4", "bf16")


def test_the_rules_carry_the_scale_in_their_multiple() -> None:
    floor = {"fp32": 1e-5, "fp16": 2e-4, "bf16": 1e-3}
    policy = Fp8KvCachePolicy(kv_share=0.1, reason="a test policy",
                              bounds={"kl_mean": Rule(multiple=4.0, floor=floor, reason="the mean, for the test")})
    rule = fp8_rules(policy, "fp8_e5m2", "bf16")["kl_mean"]
    assert rule.multiple == pytest.approx(4 * (1 + 0.1 * 1024))
    assert rule.bound(1e-3, "bf16") == pytest.approx(4 * 103.4 * 1e-3 + 1e-3)


@pytest.mark.parametrize(("cache", "healthy_x", "planted_x"), [("fp8_e4m3", 16.6, 1291.0), ("fp8_e5m2", 58.1, 1355.0)])
def test_the_shipped_bound_passes_the_measured_healthy_and_fails_the_planted(cache: str, healthy_x: float,
                                                                             planted_x: float) -> None:
    """The seed-0 figures of benchmarks/feature_fp8_kv_cache.py (KL mean as multiples of the
    control's, tiny-llama bf16): healthy within the bound with room, the planted scale beyond it."""
    control = {"kl_mean": 3.7e-4, "kl_p99": 5.5e-3}
    rules = {k: v for k, v in fp8_rules(shipped(), cache, "bf16").items() if k == "kl_mean"}
    healthy = dv.judge({"kl_mean": healthy_x * control["kl_mean"]}, control, rules, "bf16")["kl_mean"]
    planted = dv.judge({"kl_mean": planted_x * control["kl_mean"]}, control, rules, "bf16")["kl_mean"]
    assert healthy.ok and healthy.value is not None and healthy.bound is not None
    assert healthy.value < 0.5 * healthy.bound, "a healthy fp8 cache must sit well inside its bound"
    assert planted.ok is False and planted.value is not None and planted.bound is not None
    assert planted.value > 2 * planted.bound, "the planted wrong scale must fail by a margin"


def test_the_shipped_policy_says_why() -> None:
    policy = shipped()
    assert set(policy.bounds) == {"kl_mean", "kl_p99"}
    assert "kv_share" in policy.reason and all(len(r.reason) > 50 for r in policy.bounds.values())


# ------------------------------------------------------------------- fast: proof of activity --

def layer(**kw: Any) -> dict[str, Any]:
    return {"layer": "model.layers.0.self_attn.attn", "declared": "fp8_e4m3", "storage": "uint8", "element_bytes": 1,
            "backend": "fp8_e4m3", "k_scale": 1.0, "v_scale": 1.0, "bytes_written": 2304, **kw}


def test_fp8_read_back_from_config_and_tensors_is_active() -> None:
    ok, how = judge_activity("fp8_e4m3", {"kv_cache_dtype": "fp8_e4m3"}, [layer(), layer(layer="l1")])
    assert ok, how
    assert "2 attention layers store uint8 at 1 byte(s)" in how and "4,608 cache bytes written" in how


@pytest.mark.parametrize(("facts", "layers", "why"), [
    ({"kv_cache_dtype": "auto"}, [layer()], "resolved kv_cache_dtype 'auto'"),
    ({"kv_cache_dtype": "fp8_e4m3"}, [layer(storage="bfloat16", element_bytes=2, declared="auto", backend="auto")],
     "do not store fp8_e4m3"),
    ({"kv_cache_dtype": "fp8_e4m3"}, [layer(bytes_written=0)], "nothing was written"),
    ({"kv_cache_dtype": "fp8_e4m3"}, [], "no KV-cache tensor"),
    ({}, "served elsewhere", "neither the engine's config nor its cache tensors"),
])
def test_a_silent_fallback_is_not_active(facts: dict[str, Any], layers: Any, why: str) -> None:
    ok, how = judge_activity("fp8_e4m3", facts, layers)
    assert not ok and why in how


def test_a_served_engine_is_proven_by_its_config_alone() -> None:
    ok, how = judge_activity("fp8_e5m2", {"kv_cache_dtype": "fp8_e5m2"}, "runs its engine outside this process")
    assert ok and "outside this process" in how


# --------------------------------------------------------------------- fast: vLLM's refusals --

def test_vllms_not_implemented_is_its_reason_in_one_line() -> None:
    cause = NotImplementedError("FP8 KV cache on CPU requires x86 with AVX-512 or AMX.\nmore lines")
    try:
        try:
            raise cause
        except NotImplementedError as exc:
            raise FrameworkError("vLLM could not start on /m: NotImplementedError: FP8 KV cache on CPU …") from exc
    except FrameworkError as err:
        said = vllm_refusal(err, "fp8_e4m3")
    assert said == "fp8_e4m3 KV cache cannot run here; vLLM says: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."


def test_a_refusal_recorded_earlier_in_the_run_is_read_from_its_line() -> None:
    err = FrameworkError("vLLM could not start on /m: NotImplementedError: FP8 KV cache requires head_size "
                         "divisible by 32 on CPU.")
    assert vllm_refusal(err, "fp8_e5m2") == ("fp8_e5m2 KV cache cannot run here; vLLM says: FP8 KV cache requires "
                                             "head_size divisible by 32 on CPU.")


def test_any_other_load_failure_stays_an_error() -> None:
    assert vllm_refusal(FrameworkError("vLLM could not start on /m: ValueError: out of memory"), "fp8_e4m3") is None


# --------------------------------------------------------------------------- fast: params --

def test_params_default_to_both_formats_and_refuse_what_the_kind_sets() -> None:
    assert Fp8KvCacheParams(framework="vllm").formats == ["fp8_e4m3", "fp8_e5m2"]
    with pytest.raises(ValidationError, match="formats lists a format twice"):
        Fp8KvCacheParams(framework="vllm", formats=["fp8_e4m3", "fp8_e4m3"])
    with pytest.raises(ValidationError, match="Input should be 'fp8_e4m3' or 'fp8_e5m2'"):
        Fp8KvCacheParams(framework="vllm", formats=["fp8"])  # type: ignore[list-item]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_engine_args_may_not_set_the_cache_dtype() -> None:
    with pytest.raises(ValidationError, match=r"set by framework\.fp8_kv_cache itself"):
        Fp8KvCacheParams(framework="vllm", engine_args={"kv_cache_dtype": "fp8"})


def test_a_framework_without_the_argument_is_not_applicable_per_format() -> None:
    outs = Fp8KvCacheCheck().run(cast(CheckContext, None), Fp8KvCacheParams(framework="transformers"))
    assert [(o.status.value, o.applicable, o.subid) for o in outs] == [("skip", False, "fp8_e4m3"),
                                                                        ("skip", False, "fp8_e5m2")]
    assert "takes no kv_cache_dtype engine argument" in outs[0].message


# ------------------------------------------------------------- slow: one ladder, real CLI --

# Eager (compile: false): a compiled vLLM start-up costs seconds per instance, and this run loads six.
SMALL = {"teacher": {"prompts": 2, "long_prompt_tokens": 0, "chat": False, "max_tokens": 16}, "prompts": 2,
         "max_tokens": 8, "compile": False}


def fp8_check(id_: str, framework: str, formats: list[str], **params: Any) -> dict[str, Any]:
    return {"id": id_, "step": 4, "kind": "framework.fp8_kv_cache",
            "params": {"framework": framework, "formats": formats, **json.loads(json.dumps(SMALL)), **params}}


@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One run: healthy e4m3, the planted wrong scale at e5m2, and head_dim 80 (vLLM refuses)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    checks = [fp8_check("fp8.healthy", "vllm", ["fp8_e4m3"]),
              fp8_check("fp8.d80", "vllm", ["fp8_e4m3"], model="embedded:tiny-qwen2-d80")]
    if FP8_HERE:  # the planted scale needs an fp8 cache to write into
        checks.insert(1, fp8_check("fp8.planted", PLANTED, ["fp8_e5m2"]))
    return run_checks(tmp_path_factory.mktemp("fp8"), checks, timeout=1800)


def rows(check: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in check["details"]["subchecks"]}


@pytest.mark.slow
def test_the_healthy_fp8_cache_passes_with_its_proof(fp8_run: dict[str, dict[str, Any]]) -> None:
    c = fp8_run["fp8.healthy.fp8_e4m3"]
    if not FP8_HERE:
        # A CPU without AVX-512 or AMX (an AMD EPYC Zen 3 here): n/a in vLLM's own words, never a pass.
        assert (c["status"], c["applicable"]) == ("skip", False)
        assert c["message"] == ("fp8_e4m3 KV cache cannot run here; vLLM says: FP8 KV cache on CPU requires "
                                "x86 with AVX-512 or AMX.")
        return
    assert c["status"] == "pass", c["message"]
    active = rows(c)["feature active: fp8_e4m3 KV cache"]
    assert active["ok"] and "engine kv_cache_dtype 'fp8_e4m3'" in active["detail"]
    assert "store uint8 at 1 byte(s) per element" in active["detail"]
    assert c["details"]["feature"]["active"] is True and c["details"]["feature"]["layers"]
    assert c["metrics"]["kv_cache_element_bytes"] == 1
    assert 0 < c["metrics"]["tf_kl_mean_of_bound"] < 1
    assert c["details"]["teacher_forced"]["bounds"]["kl_mean"]["ok"] is True


@pytest.mark.slow
@pytest.mark.skipif(not FP8_HERE, reason="vLLM's fp8 KV cache needs AVX-512 or AMX on the CPU; this one has neither")
def test_the_cache_written_at_the_wrong_scale_fails_on_its_distributions(fp8_run: dict[str, dict[str, Any]]) -> None:
    c = fp8_run["fp8.planted.fp8_e5m2"]
    assert c["status"] == "fail"
    tf = rows(c)["teacher-forced distributions vs float64 reference (fp8_e5m2 KV cache)"]
    assert tf["ok"] is False and "kl_mean" in tf["detail"] and " > " in tf["detail"]
    # The cache was fp8 all the same: the failure is the numbers, not a fallback.
    assert rows(c)["feature active: fp8_e5m2 KV cache"]["ok"] is True


@pytest.mark.slow
def test_head_dim_80_is_not_applicable_with_vllms_reason(fp8_run: dict[str, dict[str, Any]]) -> None:
    c = fp8_run["fp8.d80.fp8_e4m3"]
    assert (c["status"], c["applicable"]) == ("skip", False)
    assert c["message"] == ("fp8_e4m3 KV cache cannot run here; vLLM says: FP8 KV cache requires head_size "
                            "divisible by 32 on CPU.")
