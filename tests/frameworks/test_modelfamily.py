"""``--model`` knows its family (frameworks.modelfamily, runfolder.with_run_model): a folder's
config.json read against its weights' tensor names, embedded and pretrained names, and the
step-4 checks of the model tagged with its families.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from adaptcheck.base.families import UNKNOWN
from adaptcheck.base.schemas.results import DeviceRef, LadderRef
from adaptcheck.frameworks.modelfamily import folder_families, named_families, weights_contradiction
from adaptcheck.ladder.loader import load_ladder
from adaptcheck.runfolder import RunMeta, with_run_model

CONFIGS = Path(__file__).parents[1] / "base" / "data" / "configs"


def _folder(tmp_path: Path, config: str, tensors: list[str]) -> Path:
    shutil.copyfile(CONFIGS / config, tmp_path / "config.json")
    save_file({name: torch.zeros(1) for name in tensors}, str(tmp_path / "model.safetensors"))
    return tmp_path


DEEPSEEK_NAMES = ["model.layers.3.self_attn.kv_a_proj_with_mqa.weight", "model.layers.3.self_attn.kv_b_proj.weight",
                  "model.layers.3.mlp.experts.0.gate_proj.weight",
                  "model.layers.3.mlp.experts.0.gate_proj.weight_scale_inv"]


def test_a_folder_whose_weights_agree_reads_as_its_config_says(tmp_path: Path) -> None:
    reading = folder_families(_folder(tmp_path, "deepseek-v3.json", DEEPSEEK_NAMES))
    assert reading is not None and reading.families == ("mla", "moe", "fp8_block") and reading.problem is None


@pytest.mark.parametrize(("config", "names", "says"), [
    # A Llama checkpoint under DeepSeek's config: no latent projection in the weights.
    ("deepseek-v3.json", ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.experts.0.w1.weight",
                          "model.layers.0.mlp.experts.0.w1.weight_scale_inv"], "config.json says mla"),
    # A GPTQ config over unquantized weights.
    ("qwen2.5-7b-instruct-gptq-int4.json", ["model.layers.0.self_attn.q_proj.weight"], "config.json says gptq"),
    # Packed int4 weights under a config that declares no quantization.
    ("qwen3-30b-a3b.json", ["model.layers.0.mlp.experts.0.gate_proj.qweight"], "packed int4"),
    ("qwen2-vl-7b-instruct.json", ["model.layers.0.self_attn.q_proj.weight"], "config.json says multimodal"),
])
def test_a_config_its_weights_contradict_is_one_line_and_unknown(tmp_path: Path, config: str, names: list[str],
                                                                 says: str) -> None:
    reading = folder_families(_folder(tmp_path, config, names))
    assert reading is not None and reading.families == (UNKNOWN,)
    assert reading.problem is not None and says in reading.problem and "\n" not in reading.problem


def test_without_weights_or_config(tmp_path: Path) -> None:
    assert folder_families(tmp_path) is None  # no config.json: the model check says why
    shutil.copyfile(CONFIGS / "bamba-9b.json", tmp_path / "config.json")
    reading = folder_families(tmp_path)  # no weights to compare with: the config's word stands
    assert reading is not None and reading.families == ("hybrid",)
    assert weights_contradiction({"dense"}, ["lm_head.weight"]) is None


def test_names_embedded_and_pretrained() -> None:
    assert named_families("embedded:tiny-moe").families == ("moe",)
    assert named_families("embedded:tiny-llama").families == ("dense",)
    assert named_families("auto").families == ("dense",)
    assert named_families("pretrained:smollm2-135m").families == ("dense",)
    nope = named_families("embedded:tiny-nothing")
    assert nope.families == (UNKNOWN,) and nope.problem


def _meta(model: str | None) -> RunMeta:
    return RunMeta(run_id="r", started_at=datetime.now(timezone.utc), command=["adaptcheck", "run"],
                   ladder=LadderRef(id="standard", version="1", source="builtin:standard", sha256="0" * 64), seed=0,
                   steps=[1, 2, 3, 4, 5], device=DeviceRef(backend="cpu", display_name="CPU", torch_device="cpu",
                                                           device_name="cpu", device_count=1), model=model)


def test_the_models_step4_checks_carry_its_family_tags(tmp_path: Path) -> None:
    spec = load_ladder("standard").spec
    folder = _folder(tmp_path, "qwen3-30b-a3b.json", ["model.layers.0.mlp.experts.0.gate_proj.weight"])
    run = with_run_model(spec, _meta(str(folder)))
    assert run.model.families == ["moe"] and run.model.quantization == "none"
    by_id = {c.id: c for c in run.checks}
    assert "family:moe" in by_id["framework.vllm.reference"].tags
    # A check naming its own model keeps its ladder's tags; a feature check certifies its feature only;
    # step 3 is model-agnostic.
    assert "family:moe" not in by_id["framework.vllm.tensor_parallel.embedded"].tags
    assert not any(t.startswith("family:") for t in by_id["framework.vllm.spec_decode.ngram"].tags)
    assert "family:moe" not in by_id["ops.rms_norm"].tags


def test_a_contradicted_folder_runs_with_the_note(tmp_path: Path) -> None:
    spec = load_ladder("quick").spec
    folder = _folder(tmp_path, "qwen2.5-7b-instruct-gptq-int4.json", ["model.layers.0.self_attn.q_proj.weight"])
    run = with_run_model(spec, _meta(str(folder)))
    assert run.model.families == [UNKNOWN] and run.model.family_note
    assert run.model.quantization == "gptq"  # what the config declares; the note says it does not fit
    assert not any(t.startswith("family:") for c in run.checks if c.step == 4 and "model" not in c.params
                   for t in c.tags if t == "family:unknown")
    json.dumps(run.model.model_dump())  # still a valid, storable model spec
