"""Step 4 on the embedded DeepSeek-V3 and Qwen3-MoE models: healthy frameworks pass, defects
planted in the DeepSeek family's own layers fail ``framework.reference``.

ONE real ``adaptcheck run`` (quick sizes) holds a CI-sized cut of the checks ladders/standard.yaml
declares per family (see :func:`family_checks`), plus the reference check of three transformers
adapters with one DeepSeek defect each (tests/steps/frameworks/planted_families.py): the router
ignoring its correction bias, the shared expert dropped, MLA with the latent's key and value
halves swapped. vLLM on a CPU turns prefix caching off for
MLA: the DeepSeek kv_cache check says so in an n/a row, read back from the engine.
"""

from __future__ import annotations

import copy
import importlib.util
from typing import Any

import pytest

from tests.conftest import run_checks

# Real processes: outside the fast lane (-m "not slow"). 688 s measured on the 2 shared cores at load
# 10-22 (other sessions' runs); the default 600 s per-test limit is for an idle machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

DEEPSEEK, QWEN3_MOE = "embedded:tiny-deepseek-v3", "embedded:tiny-qwen3-moe"
MODELS = {"ds": DEEPSEEK, "q3": QWEN3_MOE}
P = "tests.steps.frameworks.planted_families"
TEACHER = {"prompts": 3, "long_prompt_tokens": 128, "max_tokens": 16}  # the quick ladder's sizes
SIZES: dict[str, dict[str, Any]] = {
    "load": {},
    "reference": dict(TEACHER),
    "kv_cache": {"rounds": 2, "batch": 4, "prefix_tokens": 128, "max_tokens": 12, "teacher": TEACHER},
}
PLANTED = ["RoutingBiasIgnored", "MlaKvHalvesSwapped"]
"""Two of planted_families' four, one per DeepSeek trait (its routing, its latent attention); each
reference check costs ~30 s on 2 idle cores, so SharedExpertDropped and MlaQueryRopeDropped are
benchmarks/family_moe_models.py's (CI time)."""
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _check(id_: str, kind: str, framework: str, model: str, **extra: Any) -> dict[str, Any]:
    return {"id": id_, "step": 4, "kind": f"framework.{kind}",
            "params": {"framework": framework, "model": model, **copy.deepcopy(SIZES[kind]), **extra}}


def family_checks() -> list[dict[str, Any]]:
    """The CI-sized cut of the ladder's family checks: the float64 reference on transformers for
    DeepSeek (its teacher also serves the planted checks), vLLM load / reference / kv_cache on
    DeepSeek (the MLA path and its prefix-caching row) and the reference on Qwen3-MoE; the other
    kinds (concurrent, vllm serve) run in the standard ladder, not here (each more engine start-up
    costs 15-90 s on 2 cores). Grouped by (framework, model): one instance serves its checks."""
    checks = [_check("ds.transformers.reference", "reference", "transformers", DEEPSEEK)]
    checks += [_check(f"planted.{name}", "reference", f"{P}:{name}", DEEPSEEK) for name in PLANTED]
    if HAS_VLLM:
        checks += [_check(f"ds.vllm.{kind}", kind, "vllm", DEEPSEEK, compile=False)
                   for kind in ("load", "reference", "kv_cache")]
    # Qwen3-MoE on vLLM (one more engine start-up) is the standard ladder's; here its float64
    # reference on transformers keeps the model itself under test (CI time).
    checks.append(_check("q3.transformers.reference", "reference", "transformers", QWEN3_MOE))
    return checks


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return run_checks(tmp_path_factory.mktemp("families"), family_checks(), check_timeout_s=600, timeout=1800)


VLLM_DEEPSEEK_REFERENCE = ("ds.vllm.reference",)


def vllm_cpu_rotates_a_3d_query_right() -> bool:
    """Whether vLLM's CPU rotary kernel rotates a [tokens, heads, rope_dim] query like its own
    native path. vllm-cpu 0.32 (AVX2 build, measured) does not: it is right for the same data
    flattened to [tokens, heads * rope_dim] and for MLA's one-head key, wrong (errors ~4 on unit
    inputs) for the 3-D query view that DeepSeek's MLA passes it. Run in a subprocess: vLLM's
    config context must not leak into this test process."""
    import subprocess
    import sys

    code = (
        "import torch, vllm._custom_ops\n"
        "from vllm.config import VllmConfig, set_current_vllm_config\n"
        "from vllm.model_executor.layers.rotary_embedding import get_rope\n"
        "with set_current_vllm_config(VllmConfig()):\n"
        "    r = get_rope(64, max_position=4096, rope_parameters={'rope_theta': 10000.0, 'rope_type': 'default'},"
        " is_neox_style=False, dtype=torch.float32)\n"
        "    g = torch.Generator().manual_seed(0); pos = torch.arange(5)\n"
        "    q = torch.randn(5, 4, 64, generator=g); k = torch.randn(5, 1, 64, generator=g)\n"
        "    want, _ = r.forward_native(pos, q.clone(), k.clone())\n"
        "    got, _ = r.forward_cpu(pos, q.clone(), k.clone())\n"
        "    print('OK' if (got - want).abs().max().item() < 1e-4 else 'WRONG')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1:] in (["OK"], ["WRONG"]), out.stderr[-2000:]
    return out.stdout.strip().endswith("OK")


def test_every_healthy_check_passes(results: dict[str, dict[str, Any]]) -> None:
    healthy = [c for c in results if not c.startswith("planted.")]
    assert len(healthy) == len(family_checks()) - len(PLANTED) and healthy
    rope_ok = not HAS_VLLM or vllm_cpu_rotates_a_3d_query_right()
    for cid in healthy:
        if cid in VLLM_DEEPSEEK_REFERENCE and not rope_ok:
            # vLLM's own defect on this host: the check must catch it (never a pass).
            assert results[cid]["status"] == "fail", (cid, results[cid]["message"])
            assert "teacher-forced distributions vs float64 reference" in results[cid]["message"]
            continue
        assert results[cid]["status"] == "pass", (cid, results[cid]["message"])


def test_the_reference_checks_carry_teacher_forced_evidence(results: dict[str, dict[str, Any]]) -> None:
    for cid, c in results.items():
        if cid.endswith(".reference") and not cid.startswith("planted.") and cid not in VLLM_DEEPSEEK_REFERENCE:
            tf = c["details"]["teacher_forced"]
            assert tf["method"] == "teacher_forced" and tf["positions"] > 50, cid
            assert c["metrics"]["tf_kl_mean"] <= tf["bounds"]["kl_mean"]["bound"], cid


@pytest.mark.parametrize("name", PLANTED)
def test_each_planted_deepseek_defect_fails_the_reference(results: dict[str, dict[str, Any]], name: str) -> None:
    c = results[f"planted.{name}"]
    assert c["status"] == "fail", (name, c["message"])
    assert "teacher-forced distributions vs float64 reference" in c["message"]


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
def test_vllm_says_prefix_caching_is_off_for_mla(results: dict[str, dict[str, Any]]) -> None:
    rows = {r["name"]: r for r in results["ds.vllm.kv_cache"]["details"]["subchecks"]}
    hit = rows["prefix cache hit"]
    assert hit["ok"] is None and "enable_prefix_caching=False" in hit["detail"] and "MLA" in hit["detail"]
    assert "not run here: prefix cache hit" in results["ds.vllm.kv_cache"]["message"]


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
def test_vllm_ran_its_cpu_mla_backend_and_fused_moe(results: dict[str, dict[str, Any]]) -> None:
    impls = results["ds.vllm.load"]["details"]["framework"]["implementations"]
    assert "MLA" in impls["MLAAttention"]  # CPUMLABackend in vllm-cpu 0.32: the 576-wide latent cache
    assert "fused_moe" in impls["UnquantizedFusedMoEMethod"]
