"""The quantized-checkpoint writer: every scheme's tensors, decoded by the float64 reference's own
unpacker (reference_kernels/quant_weight.py), give back the dequantized weights it returned, bit
for bit; configs are spelled as published checkpoints spell them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from adaptcheck.frameworks import quant_pack as qp
from adaptcheck.frameworks.quant_writer import default_modules, quantize_state_dict, write_quantized
from reference_kernels import quant_weight as ref


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"model.embed_tokens.weight": torch.randn(50, 128, generator=gen).bfloat16(),
            "model.layers.0.input_layernorm.weight": torch.ones(128).bfloat16(),
            "model.layers.0.self_attn.q_proj.weight": (torch.randn(64, 128, generator=gen) * 0.05).bfloat16(),
            "model.layers.0.self_attn.q_proj.bias": torch.randn(64, generator=gen).bfloat16(),
            "model.layers.0.mlp.down_proj.weight": (torch.randn(128, 256, generator=gen) * 0.05).bfloat16(),
            "lm_head.weight": torch.randn(50, 128, generator=gen).bfloat16()}


PROJ = ["model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"]


def test_default_modules_are_the_projections_only() -> None:
    assert default_modules(_state()) == PROJ


def _np(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.int64).numpy() if not t.is_floating_point() else t.double().numpy()


@pytest.mark.parametrize(("scheme", "group"), [("gptq", 128), ("gptq", 32), ("gptq", -1), ("gptq_act_order", 64),
                                               ("awq", 128), ("awq", 64)])
def test_int4_round_trip_is_bit_exact(scheme: str, group: int) -> None:
    state = _state()
    ckpt = quantize_state_dict(state, scheme, group_size=group)  # type: ignore[arg-type]
    t = ckpt.tensors
    for name in PROJ:
        p = name[: -len(".weight")]
        assert name not in t and t[f"{p}.qweight"].dtype == torch.int32 and t[f"{p}.scales"].dtype == torch.float16
        # Scales mean the same in every 16-bit dtype the model may be served in.
        s = t[f"{p}.scales"]
        assert torch.equal(s.bfloat16().half(), s)
        fmt = "awq" if scheme == "awq" else "gptq"
        g_idx = _np(t[f"{p}.g_idx"]) if fmt == "gptq" else None
        deq = ref.dequantize_int4(_np(t[f"{p}.qweight"]), _np(t[f"{p}.qzeros"]), _np(s), g_idx, group, fmt)
        assert np.array_equal(deq.T, ckpt.dequantized[name].numpy())  # bit-exact
        assert ckpt.dequantized[name].dtype == torch.float64
        # Round-to-nearest: within half a step of the dense weight (codes not clamped at the edges).
        assert float((ckpt.dequantized[name] - state[name].double()).abs().max()) <= float(s.double().max()) * 1.01
        if scheme == "gptq_act_order":
            assert g_idx is not None
            k = state[name].shape[1]
            assert not np.array_equal(g_idx, np.arange(k) // group)
    assert t["model.layers.0.self_attn.q_proj.bias"] is state["model.layers.0.self_attn.q_proj.bias"]
    cfg = ckpt.quantization_config
    if scheme == "awq":
        assert cfg == {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm",
                       "modules_to_not_convert": None}
    else:
        assert (cfg["quant_method"], cfg["bits"], cfg["group_size"], cfg["sym"], cfg["checkpoint_format"]) == \
            ("gptq", 4, group, True, "gptq")
        assert cfg["desc_act"] is (scheme == "gptq_act_order")
    ref_state = ckpt.reference_state_dict(state)
    assert ref_state["lm_head.weight"] is state["lm_head.weight"] and ref_state[PROJ[0]] is ckpt.dequantized[PROJ[0]]


def test_gptq_v1_stores_zero_minus_one_and_symmetric_is_all_sevens() -> None:
    ckpt = quantize_state_dict(_state(), "gptq")
    assert bool((ckpt.tensors["model.layers.0.mlp.down_proj.qzeros"] == 0x77777777).all())


def test_w8a8_int8_round_trip_and_config() -> None:
    state = _state()
    ckpt = quantize_state_dict(state, "w8a8_int8")
    for name in PROJ:
        p = name[: -len(".weight")]
        w, s = ckpt.tensors[f"{p}.weight"], ckpt.tensors[f"{p}.weight_scale"]
        assert w.dtype == torch.int8 and s.shape == (w.shape[0], 1) and s.dtype == torch.bfloat16
        assert np.array_equal(_np(w) * _np(s), ckpt.dequantized[name].numpy())
        assert torch.equal(s.half().bfloat16(), s)  # exact in fp16 too
    group = ckpt.quantization_config["config_groups"]["group_0"]
    assert ckpt.quantization_config["quant_method"] == "compressed-tensors"
    assert ckpt.quantization_config["ignore"] == ["lm_head"] and group["targets"] == ["Linear"]
    assert (group["weights"]["strategy"], group["weights"]["dynamic"]) == ("channel", False)
    assert (group["input_activations"]["strategy"], group["input_activations"]["dynamic"]) == ("token", True)


def test_fp8_block_round_trip_and_config() -> None:
    state = _state()
    state["model.layers.0.mlp.up_proj.weight"] = torch.randn(320, 128).bfloat16()  # a partial block along N
    ckpt = quantize_state_dict(state, "fp8_block")
    for name in [*PROJ, "model.layers.0.mlp.up_proj.weight"]:
        p = name[: -len(".weight")]
        w, s = ckpt.tensors[f"{p}.weight"], ckpt.tensors[f"{p}.weight_scale_inv"]
        n, k = w.shape
        assert w.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (-(-n // 128), -(-k // 128))
        deq = _np(w.float()) * ref.expand_blocks(_np(s), n, k, 128, 128)
        assert np.array_equal(deq, ckpt.dequantized[name].numpy())
    assert ckpt.quantization_config == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                        "weight_block_size": [128, 128]}


def test_shapes_int4_cannot_pack_are_refused() -> None:
    with pytest.raises(ValueError, match="multiples of 32"):
        quantize_state_dict({"a.x_proj.weight": torch.randn(48, 128)}, "gptq")


def test_write_quantized_folder(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    src, dst = tmp_path / "dense", tmp_path / "gptq"
    src.mkdir()
    state = _state()
    save_file(state, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "bfloat16"}))
    (src / "tokenizer.json").write_text("{}")
    ckpt = write_quantized(src, dst, "gptq")
    config = json.loads((dst / "config.json").read_text())
    assert config["model_type"] == "llama" and config["quantization_config"] == ckpt.quantization_config
    assert (dst / "tokenizer.json").read_text() == "{}"
    loaded = load_file(str(dst / "model.safetensors"))
    assert set(loaded) == set(ckpt.tensors)
    assert torch.equal(loaded["model.layers.0.self_attn.q_proj.qweight"],
                       ckpt.tensors["model.layers.0.self_attn.q_proj.qweight"])


def test_packers_against_known_words() -> None:
    codes = torch.arange(8).reshape(1, 8) + 1  # columns 0..7 hold 1..8
    assert qp.pack_cols(codes).item() == 0x87654321 - 2**32  # int32: the top nibble 8 sets the sign bit
    # AWQ: nibble i holds column AWQ_ORDER[i] = 0, 2, 4, 6, 1, 3, 5, 7 → values 1, 3, 5, 7, 2, 4, 6, 8.
    assert qp.pack_cols(codes, awq=True).item() == 0x86427531 - 2**32
    assert qp.pack_rows(codes.t()).item() == 0x87654321 - 2**32
    assert ref.unpack_cols(np.array([[0x86427531 - 2**32]]), awq=True).tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
