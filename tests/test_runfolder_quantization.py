"""A local model folder's declared quantization reaches the grade (runfolder.hf_quantization).

The configs are shaped like real Hugging Face ``config.json`` files: ``quant_method: fp8``
(transformers' FineGrainedFP8 / vLLM's fp8 checkpoints), compressed-tensors W8A8 groups
(llm-compressor's int8 and fp8 recipes), GPTQ.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.schemas.results import DeviceRef, LadderRef
from adaptcheck.ladder.loader import load_ladder
from adaptcheck.runfolder import RunMeta, hf_quantization, with_run_model


def _group(kind: str, bits: int = 8, act_bits: int | None = 8) -> dict[str, Any]:
    group: dict[str, Any] = {"targets": ["Linear"], "weights": {"num_bits": bits, "type": kind, "symmetric": True}}
    if act_bits is not None:
        group["input_activations"] = {"num_bits": act_bits, "type": kind, "dynamic": True}
    return group


CONFIGS: list[tuple[str, Any, str]] = [
    ("plain bf16", None, "none"),
    ("fp8", {"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
    ("fbgemm fp8", {"quant_method": "fbgemm_fp8"}, "fp8"),
    ("ct int8 w8a8", {"quant_method": "compressed-tensors", "config_groups": {"group_0": _group("int")}}, "int8_w8a8"),
    ("ct fp8 w8a8", {"quant_method": "compressed-tensors", "config_groups": {"group_0": _group("float")}}, "fp8"),
    ("ct int4 w4a16", {"quant_method": "compressed-tensors",
                       "config_groups": {"group_0": _group("int", bits=4, act_bits=None)}}, "w4a16"),
    ("ct mixed", {"quant_method": "compressed-tensors",
                  "config_groups": {"a": _group("int"), "b": _group("float")}}, "other"),
    ("gptq", {"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq"),
    ("gptq int8: no format of its own", {"quant_method": "gptq", "bits": 8, "group_size": 128}, "other"),
    ("awq", {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "awq"),
    # DeepSeek-V3's published config: fp8 with 128x128 weight blocks.
    ("block fp8", {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                   "weight_block_size": [128, 128]}, "fp8_block"),
    # Malformed: read as an unknown quantization (every quantized check counts), never a crash.
    ("ct groups not a mapping", {"quant_method": "compressed-tensors", "config_groups": ["w8a8"]}, "other"),
    ("config not a mapping", "fp8", "other"),
    ("ct group not a mapping", {"quant_method": "compressed-tensors", "config_groups": {"g": "int8"}}, "other"),
]


def _model_folder(tmp_path: Path, quant: Any) -> Path:
    config: dict[str, Any] = {"model_type": "llama", "torch_dtype": "bfloat16"}
    if quant is not None:
        config["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(("what", "quant", "expected"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_a_folders_quantization_config_names_its_format(tmp_path: Path, what: str, quant: Any,
                                                         expected: str) -> None:
    assert hf_quantization(_model_folder(tmp_path, quant)) == expected, what


def test_no_readable_config_says_nothing(tmp_path: Path) -> None:
    assert hf_quantization(tmp_path) is None
    (tmp_path / "config.json").write_text("{not json")
    assert hf_quantization(tmp_path) is None


def _meta(model: str | None) -> RunMeta:
    return RunMeta(run_id="r", started_at=datetime.now(timezone.utc), command=["adaptcheck", "run"],
                   ladder=LadderRef(id="quick", version="1", source="builtin:quick", sha256="0" * 64), seed=0,
                   steps=[1], device=DeviceRef(backend="cpu", display_name="CPU", torch_device="cpu",
                                               device_name="cpu", device_count=1), model=model)


def test_model_from_the_command_line_brings_its_quantization(tmp_path: Path) -> None:
    spec = load_ladder("quick").spec
    # The ladder's own model: its families are filled in (auto is a dense pretrained decoder), nothing else.
    own = with_run_model(spec, _meta(None))
    assert own.model.model_copy(update={"families": []}) == spec.model and own.model.families == ["dense"]
    int8 = _model_folder(tmp_path, CONFIGS[3][1])
    assert with_run_model(spec, _meta(str(int8))).model.quantization == "int8_w8a8"
    # A ladder that says fp8, run with an unquantized folder, certifies what the folder is.
    fp8_ladder = spec.model_copy(update={"model": spec.model.model_copy(update={"quantization": "fp8"})})
    (tmp_path / "plain").mkdir()
    plain = _model_folder(tmp_path / "plain", None)
    assert with_run_model(fp8_ladder, _meta(str(plain))).model.quantization == "none"
    # An embedded model has no config.json: the ladder's value stands.
    assert with_run_model(fp8_ladder, _meta("embedded:tiny-llama")).model.quantization == "fp8"
