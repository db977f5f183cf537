"""``--serve``: the deployment read by vLLM's own parser, checked against the machine, and applied to
every check of the deployed model (adaptcheck.frameworks.deployment, steps.frameworks.lifecycle)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.errors import UsageError
from adaptcheck.base.schemas.deployment import Deployment
from adaptcheck.base.units import memory_size
from adaptcheck.frameworks.deployment import DeploymentError, _deployment, check_fits, read_serve
from adaptcheck.frameworks.modelsrc import resolve_model

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


@pytest.fixture(scope="module")
def tiny() -> Path:
    return resolve_model("embedded:tiny-llama").path


def _dep(tiny: Path, **args: Any) -> Deployment:
    return _deployment("vllm", ["vllm", "serve", str(tiny)], str(tiny), dict(args), {}, "0.32.0")


def test_the_record_lifts_the_settings_and_names_the_features_it_turns_on(tiny: Path) -> None:
    dep = _dep(tiny, tensor_parallel_size=2, enable_prefix_caching=True, enforce_eager=True, max_model_len=512,
               kv_cache_dtype="fp8", seed=7, served_model_name="x", block_size=32)
    assert (dep.tensor_parallel_size, dep.max_model_len, dep.compile_mode, dep.kv_cache_dtype) == (2, 512, "eager", "fp8")
    assert dep.enable_prefix_caching is True
    assert dep.features == ["tensor_parallel", "prefix_caching", "fp8_kv_cache"]
    # adaptcheck's own settings (seed, served name) are not the deployment's; the rest are kept as given.
    assert dep.engine_args == {"kv_cache_dtype": "fp8", "block_size": 32}
    assert dep.dtype == "bf16"  # the embedded model's config.json
    assert "--tensor-parallel-size 2" in dep.normalized
    assert dep.digest[:12] in dep.summary() and "TP 2" in dep.summary()


def test_the_digest_names_what_is_certified_and_nothing_else(tiny: Path) -> None:
    base = _dep(tiny, tensor_parallel_size=2)
    assert _dep(tiny, tensor_parallel_size=2, seed=3, served_model_name="y").digest == base.digest
    assert _dep(tiny, tensor_parallel_size=1).digest != base.digest
    assert _dep(tiny, tensor_parallel_size=2, max_model_len=256).digest != base.digest
    assert _dep(tiny, tensor_parallel_size=2, enforce_eager=True).digest != base.digest
    # Compiled is vLLM's default: graph capture is deployed unless the command says --enforce-eager.
    assert "graph_capture" in base.features and "graph_capture" not in _dep(tiny, enforce_eager=True).features


def test_a_deployment_needs_the_ranks_it_asks_for(tiny: Path) -> None:
    dep = _dep(tiny, tensor_parallel_size=4)
    check_fits(dep, device_type="cpu", device_count=1, host_rank_env="VLLM_CPU_OMP_THREADS_BIND", cores=4)
    with pytest.raises(DeploymentError, match="needs 4 CPU cores, one per rank; this process may use 2"):
        check_fits(dep, device_type="cpu", device_count=1, host_rank_env="VLLM_CPU_OMP_THREADS_BIND", cores=2)
    with pytest.raises(DeploymentError, match="needs 4 devices; 2 are visible"):
        check_fits(dep, device_type="cuda", device_count=2, host_rank_env=None, cores=64)
    check_fits(dep, device_type="cuda", device_count=8, host_rank_env=None, cores=64)


def test_a_model_that_is_not_here_is_refused_before_vllm_is_asked(tmp_path: Path) -> None:
    with pytest.raises(DeploymentError, match="not a local model folder"):
        read_serve(f"vllm serve {tmp_path / 'nosuch'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DeploymentError, match=r"not a model folder \(no config.json"):
        read_serve(f"vllm serve {tmp_path / 'empty'}")
    with pytest.raises(DeploymentError, match="is not `vllm serve`"):
        read_serve("vllm bench serve")
    with pytest.raises(DeploymentError, match="not a command line"):
        read_serve("vllm serve 'unclosed")


def test_another_server_must_say_where_it_listens() -> None:
    with pytest.raises(DeploymentError, match="must give --port N"):
        read_serve("llama-server -m model.gguf")
    dep = read_serve("llama-server --port 8123 --host 127.0.0.1")
    assert (dep.engine, dep.port, dep.features) == ("server", 8123, [])


@needs_vllm
def test_vllm_reads_the_command_with_its_own_parser_and_config_file(tiny: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("tensor-parallel-size: 2\nmax-model-len: 640\nenable-prefix-caching: true\n")
    dep = read_serve(f"python -m vllm.entrypoints.openai.api_server --model {tiny} --config {cfg} --block-size 32 "
                     "--port 8011 --enforce-eager")
    assert dep.engine == "vllm" and dep.engine_version
    assert (dep.tensor_parallel_size, dep.max_model_len, dep.enable_prefix_caching) == (2, 640, True)
    assert dep.engine_args == {"block_size": 32}
    assert "--port" not in dep.server_args  # adaptcheck picks its own port
    # vLLM's own message for a flag it does not have, in one line, before anything runs.
    with pytest.raises(DeploymentError, match=r"unrecognized arguments: --max-model-length 64"):
        read_serve(f"vllm serve {tiny} --max-model-length 64")


def test_sizes_are_read_as_people_write_them() -> None:
    assert memory_size("400MB", "--x") == 400_000_000
    assert memory_size("1.5GiB", "--x") == 1_610_612_736
    assert memory_size("2048", "--x") == 2048
    for bad in ("lots", "-1GB", "0", "12 parsecs"):
        with pytest.raises(UsageError):
            memory_size(bad, "--x")


def test_a_command_started_as_given_keeps_the_port_it_listens_on(tiny: Path) -> None:
    """SGLang and other servers are started as given: adaptcheck talks to the port the command names
    (vLLM's port is adaptcheck's own choice, so it is not the record's)."""
    sglang = _deployment("sglang", ["python", "-m", "sglang.launch_server"], str(tiny), {"tensor_parallel_size": 2},
                         {"port": 30000, "host": "127.0.0.1"}, None)
    assert (sglang.port, sglang.host, sglang.tensor_parallel_size) == (30000, "127.0.0.1", 2)
    vllm = _deployment("vllm", ["vllm", "serve", str(tiny)], str(tiny), {}, {"port": 8000}, "0.32.0")
    assert vllm.port is None and vllm.server_args == []
