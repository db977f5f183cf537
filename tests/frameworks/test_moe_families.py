"""The DeepSeek-V3 and Qwen3-MoE embedded variants' specs and layouts (no model is written: fast),
and the kv_cache check's reading of an engine that turned prefix caching off (vLLM for MLA on CPU).
The models themselves are exercised end to end by tests/steps/frameworks/test_family_models.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from adaptcheck.frameworks.synthetic import ARCH_WRITERS, EMBEDDED
from adaptcheck.frameworks.synthetic_families.moe_families import DEEPSEEK_V3, QWEN3_MOE
from adaptcheck.steps.frameworks.kinds.kv_cache import engine_turned_prefix_caching_off


def _layout(spec: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    return {name: (shape, kind) for name, shape, kind in ARCH_WRITERS[spec.model_type].layout(spec)}


def test_both_variants_are_registered_with_their_writers() -> None:
    assert EMBEDDED["tiny-deepseek-v3"] is DEEPSEEK_V3 and EMBEDDED["tiny-qwen3-moe"] is QWEN3_MOE
    assert {"deepseek_v3", "qwen3_moe"} <= set(ARCH_WRITERS)


def test_deepseek_latent_is_the_576_wide_head_vllm_cpu_mla_needs() -> None:
    k = DEEPSEEK_V3.knob
    assert k("kv_lora_rank") + k("qk_rope_head_dim") == 576
    layout = _layout(DEEPSEEK_V3)
    a = "model.layers.1.self_attn."
    assert layout[a + "kv_a_proj_with_mqa.weight"][0] == (576, DEEPSEEK_V3.hidden_size)
    heads = DEEPSEEK_V3.num_heads
    assert layout[a + "kv_b_proj.weight"][0] == (heads * (k("qk_nope_head_dim") + k("v_head_dim")), 512)
    assert layout[a + "q_b_proj.weight"][0] == (heads * (k("qk_nope_head_dim") + k("qk_rope_head_dim")),
                                                k("q_lora_rank"))


def test_deepseek_first_layer_dense_then_routed_and_shared_experts_with_a_bias() -> None:
    layout = _layout(DEEPSEEK_V3)
    assert "model.layers.0.mlp.gate_proj.weight" in layout and "model.layers.0.mlp.gate.weight" not in layout
    for layer in range(1, DEEPSEEK_V3.num_layers):
        m = f"model.layers.{layer}.mlp."
        assert layout[m + "gate.e_score_correction_bias"] == ((8,), "correction_bias")
        assert m + "shared_experts.down_proj.weight" in layout
        assert sum(n.startswith(m + "experts.") and n.endswith("up_proj.weight") for n in layout) == 8
    # 8 experts in 4 groups, 2 groups kept, 2 experts per token: grouping restricts the choice.
    assert (DEEPSEEK_V3.num_experts, DEEPSEEK_V3.knob("n_group"), DEEPSEEK_V3.knob("topk_group"),
            DEEPSEEK_V3.experts_per_token) == (8, 4, 2, 2)


def test_deepseek_special_inits() -> None:
    init = ARCH_WRITERS["deepseek_v3"].init
    assert init is not None
    gen = torch.Generator().manual_seed(0)
    bias = init("b", (8,), "correction_bias", gen)
    assert bias is not None and bias.abs().min() > 0.03  # non-zero: ignoring it changes the routing
    gaps = bias.sort().values.diff()
    assert gaps.min() > 0.05  # evenly spread: no two experts nearly equal
    kv_a = init("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", (576, 256), "latent_down", gen)
    assert kv_a is not None
    # Latent rows large (eps-insensitive RMSNorm), rotary key rows at the usual scale.
    assert kv_a[:512].std() > 1.0 and kv_a[512:].std() < 0.1
    assert init("x", (4, 4), "linear", gen) is None


def test_qwen3_moe_has_qk_norms_and_eight_experts() -> None:
    layout = _layout(QWEN3_MOE)
    a = "model.layers.0.self_attn."
    assert layout[a + "q_norm.weight"] == ((QWEN3_MOE.head_dim,), "norm_gain")
    assert layout[a + "k_norm.weight"] == ((QWEN3_MOE.head_dim,), "norm_gain")
    assert layout["model.layers.1.mlp.gate.weight"][0] == (8, QWEN3_MOE.hidden_size)


class _Engine:
    display_name = "vLLM (test)"

    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts

    def engine_facts(self) -> dict[str, Any]:
        return self.facts


@pytest.mark.parametrize(("facts", "expect"), [
    ({"enable_prefix_caching": True, "use_mla": False}, None),
    ({}, None),  # the framework cannot tell: the hit counter decides
    ({"enable_prefix_caching": False, "enable_chunked_prefill": False, "use_mla": True}, "MLA"),
    ({"enable_prefix_caching": False, "use_mla": False}, "enable_prefix_caching=False"),
])
def test_an_engine_that_turned_prefix_caching_off_is_named(facts: dict[str, Any], expect: str | None) -> None:
    why = engine_turned_prefix_caching_off(_Engine(facts))  # type: ignore[arg-type]
    if expect is None:
        assert why is None
    else:
        assert why is not None and expect in why and "turned prefix caching off" in why
