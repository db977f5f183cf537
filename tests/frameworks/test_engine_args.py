"""Engine arguments from the ladder: names checked against the installed vLLM, reserved names
pointed at their param, and ``vllm serve`` flags that vLLM's own parser reads back."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from pydantic import ValidationError

from adaptcheck.frameworks import engine_args as ea
from adaptcheck.frameworks.base import LoadOptions
from adaptcheck.frameworks.endpoint_fw import VllmServeFramework
from adaptcheck.steps.frameworks.params import FrameworkParams

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_an_unknown_name_is_refused_with_the_closest_one() -> None:
    with pytest.raises(ValidationError, match=r"engine_args.kv_cache_dtyp: not an engine argument .*did you mean 'kv_cache_dtype'"):
        FrameworkParams(framework="vllm", engine_args={"kv_cache_dtyp": "fp8"})


def test_a_name_adaptcheck_sets_points_at_its_param() -> None:
    with pytest.raises(ValidationError, match=r"engine_args.enforce_eager: adaptcheck sets this one: .*param compile"):
        FrameworkParams(framework="vllm_serve", engine_args={"enforce_eager": True})
    with pytest.raises(ValidationError, match=r"engine_args.seed: adaptcheck sets this one"):
        FrameworkParams(framework="vllm", engine_args={"seed": 3})


def test_an_adapter_without_engine_args_refuses_any() -> None:
    with pytest.raises(ValidationError, match=r"engine_args.block_size: .*transformers.* takes no engine arguments"):
        FrameworkParams(framework="transformers", engine_args={"block_size": 16})


def test_known_names_pass_and_select_their_own_instance() -> None:
    p = FrameworkParams(framework="vllm", engine_args={"kv_cache_dtype": "fp8_e4m3", "block_size": 16})
    q = FrameworkParams(framework="vllm")
    assert p.load_overrides()["engine_args"] == {"kv_cache_dtype": "fp8_e4m3", "block_size": 16}
    assert q.load_overrides()["engine_args"] == {}


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
def test_names_are_the_installed_engine_args_fields() -> None:
    from vllm.engine.arg_utils import EngineArgs

    assert ea.vllm_engine_arg_names() == frozenset(f.name for f in dataclasses.fields(EngineArgs))


def test_without_vllm_the_shipped_list_stands_in(monkeypatch: pytest.MonkeyPatch) -> None:
    ea.vllm_engine_arg_names.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    try:
        assert ea.vllm_engine_arg_names() is ea.VLLM_032_NAMES
        assert {"kv_cache_dtype", "speculative_config", "num_gpu_blocks_override"} <= ea.VLLM_032_NAMES
    finally:
        monkeypatch.undo()
        ea.vllm_engine_arg_names.cache_clear()


def test_serve_flags_spell_each_value_the_way_the_cli_reads_it() -> None:
    flags = ea.serve_flags({"kv_cache_dtype": "fp8_e4m3", "enable_chunked_prefill": False, "disable_log_stats": True,
                            "speculative_config": {"method": "ngram", "num_speculative_tokens": 3},
                            "cudagraph_capture_sizes": [1, 2, 4], "quantization": None, "block_size": 16})
    assert flags == ["--kv-cache-dtype", "fp8_e4m3", "--no-enable-chunked-prefill", "--disable-log-stats",
                     "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}',
                     "--cudagraph-capture-sizes", "1", "2", "4", "--block-size", "16"]


def test_the_served_adapter_puts_engine_args_and_tensor_parallel_on_the_command_line() -> None:
    opts = LoadOptions(model_path=Path("m"), engine_args={"kv_cache_dtype": "fp8_e5m2"}, tensor_parallel_size=2)
    args = VllmServeFramework()._server_args(opts)
    assert args[:4] == ["--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8_e5m2"]
    assert "--max-logprobs" in args


@pytest.mark.slow  # importing vLLM's CLI parser costs ~10 s
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
def test_vllms_own_parser_reads_the_flags_back() -> None:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    given = {"kv_cache_dtype": "fp8_e4m3", "enable_chunked_prefill": False, "num_gpu_blocks_override": 8,
             "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}, "cudagraph_capture_sizes": [1, 2, 4]}
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m", *ea.serve_flags(given)])
    for name, value in given.items():
        assert getattr(parsed, name) == value, name


def test_a_config_model_refusing_a_value_reads_as_field_value_and_message() -> None:
    from typing import Literal

    from pydantic import BaseModel

    from adaptcheck.base.errors import exception_line

    class CacheConfig(BaseModel):
        cache_dtype: Literal["auto", "fp8"]

    with pytest.raises(ValidationError) as info:
        CacheConfig(cache_dtype="fp9")  # type: ignore[arg-type]
    assert exception_line(info.value) == "ValidationError: CacheConfig.cache_dtype = 'fp9': Input should be 'auto' or 'fp8'"
    assert exception_line(ValueError("first\nsecond")) == "ValueError: first"


def test_a_config_refusing_a_combination_reads_as_its_message() -> None:
    # vLLM's VllmConfig checks combinations after the fields (heads vs tensor_parallel_size): the
    # error has no field and the whole config as its input; the line must still say why.
    from pydantic import BaseModel, model_validator

    from adaptcheck.base.errors import exception_line

    class VllmConfig(BaseModel):
        heads: int
        tp: int
        notes: str = "x" * 500

        @model_validator(mode="after")
        def _divides(self) -> VllmConfig:
            if self.heads % self.tp:
                raise ValueError(f"heads ({self.heads}) must be divisible by tensor parallel size ({self.tp})")
            return self

    with pytest.raises(ValidationError) as info:
        VllmConfig(heads=9, tp=2)
    assert exception_line(info.value) == ("ValidationError: VllmConfig: Value error, heads (9) must be divisible by "
                                          "tensor parallel size (2)")
