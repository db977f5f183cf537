"""A model's families from its config.json (base.families.read_families), on configs shaped like
the published ones (tests/base/data/configs: DeepSeek-V3, Qwen3-30B-A3B, Qwen2-VL-7B-Instruct,
Jamba-v0.1, Bamba-9B, Granite-4.0-H, and GPTQ / AWQ / compressed-tensors W8A8 and W4A16
checkpoints; configs only, no weights), and the bad inputs: no architecture, no shape at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptcheck.base.families import (
    FAMILIES,
    FAMILY_TABLE,
    QUANT_FORMATS,
    UNKNOWN,
    graded_families,
    read_families,
)

CONFIGS = Path(__file__).parent / "data" / "configs"

PUBLISHED = [
    # DeepSeek-V3 is published in block fp8: MLA, MoE and fp8_block, all three.
    ("deepseek-v3.json", ("mla", "moe", "fp8_block"), "fp8_block"),
    ("qwen3-30b-a3b.json", ("moe",), "none"),
    ("qwen2-vl-7b-instruct.json", ("multimodal",), "none"),
    # Jamba: Mamba layers and MoE layers.
    ("jamba-v0.1.json", ("moe", "hybrid"), "none"),
    ("bamba-9b.json", ("hybrid",), "none"),
    ("granite-4.0-h-small.json", ("moe", "hybrid"), "none"),
    ("qwen2.5-7b-instruct-gptq-int4.json", ("dense", "gptq"), "gptq"),
    ("qwen2.5-7b-instruct-awq.json", ("dense", "awq"), "awq"),
    ("llama-3.1-8b-instruct-w8a8.json", ("dense", "int8_w8a8"), "int8_w8a8"),
    ("llama-3.1-8b-instruct-w4a16.json", ("dense", "w4a16"), "w4a16"),
]


@pytest.mark.parametrize(("name", "families", "quantization"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_configs_read_as_their_families(name: str, families: tuple[str, ...], quantization: str) -> None:
    reading = read_families(json.loads((CONFIGS / name).read_text()))
    assert reading.families == families
    assert reading.quantization == quantization
    assert reading.problem is None
    # Every family read says why, in one phrase each.
    assert len(reading.evidence) == len(families)


def test_the_evidence_names_the_field_that_decided() -> None:
    reading = read_families(json.loads((CONFIGS / "deepseek-v3.json").read_text()))
    assert reading.evidence[:2] == ("kv_lora_rank=512 → mla", "n_routed_experts=256 → moe")


def test_a_multimodal_config_nests_its_language_model() -> None:
    # Llava/Qwen2.5-VL-style: the decoder's fields sit under text_config; a MoE decoder there is read too.
    config = {"architectures": ["X"], "vision_config": {"depth": 2},
              "text_config": {"model_type": "qwen3_moe", "num_experts": 8, "hidden_size": 64, "num_attention_heads": 4}}
    assert read_families(config).families == ("moe", "multimodal")


def test_sliding_window_layer_types_are_not_state_space() -> None:
    # Qwen2/3 and Gemma configs list layer_types of attention kinds: still dense.
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4,
              "layer_types": ["full_attention", "sliding_attention"]}
    assert read_families(config).families == ("dense",)
    qwen3_next = {**config, "model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}
    assert "hybrid" in read_families(qwen3_next).families


def test_an_unknown_family_is_one_line_and_counts_every_family_check() -> None:
    nothing = read_families({"torch_dtype": "bfloat16"})
    assert nothing.families == (UNKNOWN,) and nothing.problem is not None
    assert "\n" not in nothing.problem and "names no architecture" in nothing.problem
    shapeless = read_families({"architectures": ["WhisperForConditionalGeneration"], "d_model": 384})
    assert shapeless.families == (UNKNOWN,)
    assert shapeless.problem is not None and "WhisperForConditionalGeneration" in shapeless.problem
    # The strict reading: every family-tagged check counts for an unknown family.
    assert graded_families(["family:mla"], [UNKNOWN]) and graded_families(["family:gptq"], [UNKNOWN])


def test_family_tags_count_only_for_the_models_families() -> None:
    assert graded_families([], ["dense"])  # untagged: always
    assert not graded_families(["family:mla"], ["dense"])
    assert graded_families(["family:mla", "family:moe"], ["moe"])
    assert not graded_families(["family:moe"], [])


@pytest.mark.parametrize(("quant", "expected"), [
    ({"quant_method": "gptq", "bits": 8}, "other"),  # GPTQ int8: no int4 kernel applies
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "other"),
    ("fp8", "other"),  # not an object
    ({"quant_method": "fp8"}, "fp8"),  # per-tensor
])
def test_quantizations_without_their_own_format_are_other(quant: object, expected: str) -> None:
    reading = read_families({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
                             "quantization_config": quant})
    assert reading.quantization == expected
    if expected == "other":
        assert reading.notes and "every quantized check counts" in reading.notes[0]
        assert reading.families == ("dense",)


def test_the_registry_names_every_quant_format_as_a_family_and_refuses_typos() -> None:
    assert set(QUANT_FORMATS) <= set(FAMILIES)
    assert FAMILY_TABLE.unknown("mla") is None
    complaint = FAMILY_TABLE.unknown("multimodel")
    assert complaint is not None and "did you mean 'multimodal'" in complaint
    names, problems = FAMILY_TABLE.parse(["mla,moe", "moe", " hybrid "])
    assert names == ["mla", "moe", "hybrid"] and not problems


def test_language_config_lays_the_text_model_over_the_whole() -> None:
    from adaptcheck.base.families import language_config

    vl = {"model_type": "qwen2_vl", "torch_dtype": "bfloat16", "text_config": {"num_hidden_layers": 28}}
    assert language_config(vl) == {**vl, "num_hidden_layers": 28}
    assert language_config({"llm_config": {"num_attention_heads": 8}})["num_attention_heads"] == 8
    plain = {"num_hidden_layers": 2}
    assert language_config(plain) == plain and language_config(plain) is not plain
