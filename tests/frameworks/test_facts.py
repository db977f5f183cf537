"""The adapters' typed facts (FrameworkFacts, ModelFacts, the vLLM platform report) keep the keys,
order and values the report stored before they were typed; nothing is loaded here."""

from __future__ import annotations

from pathlib import Path

from adaptcheck.base.schemas.framework_evidence import FrameworkInfo, ModelInfo
from adaptcheck.frameworks.base import LoadOptions
from adaptcheck.frameworks.endpoint_fw import EndpointFramework, VllmServeFramework
from adaptcheck.frameworks.modelsrc import resolve_model
from adaptcheck.frameworks.server import ManagedServer, ServerSpec
from adaptcheck.frameworks.transformers_fw import TransformersFramework
from adaptcheck.frameworks.vllm_fw import PlatformPlugin, PlatformReport, VllmFramework


def test_vllm_facts_carry_each_plugins_keys_only_where_they_apply() -> None:
    fw = VllmFramework()
    plugins = [PlatformPlugin(name="cpu", source="built-in"), PlatformPlugin(name="ascend", source="vllm_ascend:register")]
    plugins[0].answer = "vllm.platforms.cpu.CpuPlatform"
    plugins[1].load_error = "ImportError: no torch_npu"
    fw.platform = PlatformReport(platform="vllm.platforms.cpu.CpuPlatform", device_type="cpu", vllm_target_device=None,
                                 platform_plugins=plugins, general_plugins=[])
    fw.opts = LoadOptions(model_path=Path("/m"), dtype="bf16", compile=False)
    fw.impls = {"RMSNorm": "custom op (forward_cpu)"}
    facts = fw.describe()
    assert list(facts)[2:] == ["platform", "device_type", "vllm_target_device", "platform_plugins", "general_plugins",
                               "dtype", "enforce_eager", "enable_prefix_caching", "tensor_parallel_size",
                               "max_logprobs", "implementations"]
    assert facts["platform_plugins"] == [
        {"name": "cpu", "source": "built-in", "answer": "vllm.platforms.cpu.CpuPlatform"},
        {"name": "ascend", "source": "vllm_ascend:register", "load_error": "ImportError: no torch_npu"}]
    assert facts["enforce_eager"] is True and facts["max_logprobs"] is None
    info = FrameworkInfo.model_validate({**facts, "name": "vllm", "loaded": True})
    assert info.extras["platform_plugins"] == facts["platform_plugins"]


def test_unloaded_adapters_describe_themselves() -> None:
    assert VllmFramework().describe()["framework"] == "vllm"
    assert set(VllmFramework().describe()) == {"framework", "vllm"}
    t = TransformersFramework().describe()
    assert list(t) == ["framework", "transformers", "device", "dtype", "attention"] and t["attention"] is None
    e = EndpointFramework().describe()
    assert e == {"framework": "endpoint", "url": None, "served_model": None, "capabilities": {}}


def test_a_launched_server_adds_its_process(tmp_path: Path) -> None:
    fw = VllmServeFramework()
    fw.server = ManagedServer(ServerSpec("vllm", tmp_path), tmp_path)  # never started
    facts = fw.describe()
    assert list(facts)[-6:] == ["server_command", "server_log", "server_startup_s", "server_pid", "enforce_eager",
                                "tensor_parallel_size"]
    assert facts["server_pid"] is None
    # Read from the command line the server was (or would be) started with: vLLM's default is compiled, one rank.
    assert (facts["enforce_eager"], facts["tensor_parallel_size"]) == (False, 1)


def test_model_facts_read_back_as_model_info(tiny_llama: Path) -> None:
    model = resolve_model(str(tiny_llama))
    facts = model.describe()
    info = ModelInfo.model_validate(facts)
    assert info.path == str(tiny_llama) and info.weights_sha256 == facts["weights_sha256"]
    assert info.dump() == {k: v for k, v in facts.items()}


def test_an_embedded_model_names_its_synthetic_identity() -> None:
    facts = resolve_model("embedded:tiny-llama").describe()
    syn = facts["synthetic"]
    assert list(syn) == ["name", "seed", "generator_version", "spec_hash", "num_params", "eos_step"]
    assert syn["name"] == "tiny-llama" and syn["seed"] == 0


def test_synthetic_metadata_is_read_typed_with_unknown_keys_kept(tmp_path: Path) -> None:
    import json

    from adaptcheck.frameworks.synthetic import METADATA_FILE, synthetic_info

    meta = {"created_by": "adaptcheck", "name": "tiny-llama", "seed": 3, "num_params": 10, "later_key": [1, 2],
            "stop_probe": {"prompt": "p", "stop": "st", "max_tokens": 8, "stop_token_index": 2,
                           "text_before_stop": "a", "greedy_text": "ast", "greedy_token_ids": [4, 5],
                           "min_logprob_gap": 0.5}}
    (tmp_path / METADATA_FILE).write_text(json.dumps(meta))
    assert synthetic_info(tmp_path) == meta
    (tmp_path / METADATA_FILE).write_text(json.dumps({**meta, "seed": "three"}))
    assert synthetic_info(tmp_path) is None  # not the shape adaptcheck writes
    (tmp_path / METADATA_FILE).write_text(json.dumps({**meta, "created_by": "someone"}))
    assert synthetic_info(tmp_path) is None
