"""Writing a weight-quantized copy of a dense checkpoint, as published checkpoints store it:
GPTQ (with or without act-order), AWQ, compressed-tensors W8A8 int8, DeepSeek-style block fp8.

Given the float state dict of a model (Linear weights [N, K] = [out, in]), :func:`quantize_state_dict`
returns the quantized tensors, the ``quantization_config`` for config.json spelled as the
quantizers write it (and as vLLM's gptq / awq / compressed-tensors / fp8 configs read it), and
the exact dequantized float64 weight of every quantized Linear: a float64 reference of the
quantized model built from them is exact, not an approximation of the checkpoint.
:func:`write_quantized` does the same from a model folder to a new one.

Exactness: int4 and int8 scales are rounded to values that bf16, fp16 and fp32 all hold
exactly (8 significant bits, in fp16's normal range), so the dequantized weight is the same
whichever of those dtypes the model is served in; fp8 block scales are float32 and the
product fp8 × fp32 is exact in float64.

The quantization itself is round-to-nearest over each group's min/max (no calibration): the
checks need the format, not a good model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from adaptcheck.frameworks.quant_pack import quantize_block_fp8, quantize_int4, quantize_int8_channel

Scheme = Literal["gptq", "gptq_act_order", "awq", "w8a8_int8", "fp8_block"]
SCHEMES: tuple[str, ...] = ("gptq", "gptq_act_order", "awq", "w8a8_int8", "fp8_block")

FP8_BLOCK = (128, 128)
"""DeepSeek-V3's weight_block_size."""

_NEVER = ("embed", "lm_head", "norm")


def default_modules(state: dict[str, torch.Tensor]) -> list[str]:
    """The Linear weights quantized when none are named: 2-D ``*_proj.weight`` tensors (the
    attention and MLP projections of Llama-style decoders), never embeddings, norms or lm_head."""
    return sorted(name for name, t in state.items()
                  if name.endswith("_proj.weight") and t.dim() == 2 and t.is_floating_point()
                  and not any(word in name for word in _NEVER))


@dataclass
class QuantizedCheckpoint:
    """A quantized state dict with its config entry and exact dequantized weights."""

    tensors: dict[str, torch.Tensor]
    """What the safetensors file holds: quantized modules' tensors, the rest unchanged."""
    quantization_config: dict[str, Any]
    """config.json's ``quantization_config``."""
    dequantized: dict[str, torch.Tensor] = field(default_factory=dict)
    """``<module>.weight`` → [N, K] float64 weight the checkpoint means, for each quantized module."""

    def reference_state_dict(self, dense: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The dense state dict with every quantized weight replaced by its exact dequantized value."""
        return {name: self.dequantized.get(name, t) for name, t in dense.items()}


def _gptq_config(group_size: int, desc_act: bool) -> dict[str, Any]:
    # As AutoGPTQ / GPTQModel write quantize_config (v1 checkpoint format: zeros stored - 1).
    return {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": desc_act, "sym": True,
            "damp_percent": 0.01, "static_groups": False, "true_sequential": True, "lm_head": False,
            "checkpoint_format": "gptq", "model_name_or_path": None, "model_file_base_name": None}


def _awq_config(group_size: int) -> dict[str, Any]:
    # As AutoAWQ writes it (GEMM kernels: interleaved packing along N).
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": None}


def _w8a8_config(ignore: list[str]) -> dict[str, Any]:
    # As llm-compressor writes a W8A8 int8 model: static per-channel weights, dynamic per-token activations.
    def args(strategy: str, dynamic: bool) -> dict[str, Any]:
        return {"num_bits": 8, "type": "int", "symmetric": True, "strategy": strategy, "dynamic": dynamic,
                "group_size": None, "block_structure": None, "actorder": None,
                "observer": None if dynamic else "minmax", "observer_kwargs": {}}

    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "global_compression_ratio": None, "ignore": ignore, "kv_cache_scheme": None, "sparsity_config": {},
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": args("channel", False),
                                          "input_activations": args("token", True), "output_activations": None,
                                          "format": "int-quantized"}}}


def _fp8_block_config() -> dict[str, Any]:
    # As DeepSeek-V3's config.json has it.
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(FP8_BLOCK)}


def quantize_state_dict(state: dict[str, torch.Tensor], scheme: Scheme, group_size: int = 128,
                        modules: Iterable[str] | None = None, ignore: Iterable[str] = ("lm_head",)) -> QuantizedCheckpoint:
    """Quantize the named Linear weights (``<module>.weight``; default :func:`default_modules`).

    ``group_size`` (int4 schemes): K rows per scale, -1 for one per output channel.
    ``ignore``: compressed-tensors' list of Linear modules left in float (every other Linear
    is quantized by its ``targets: [Linear]``).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    names = list(modules) if modules is not None else default_modules(state)
    tensors = dict(state)
    out = QuantizedCheckpoint(tensors, {})
    for name in names:
        if not name.endswith(".weight") or state[name].dim() != 2:
            raise ValueError(f"{name}: not a Linear weight [out, in]")
        prefix = name[: -len(".weight")]
        w = state[name]
        n, k = w.shape
        del tensors[name]
        if scheme in ("gptq", "gptq_act_order", "awq"):
            if k % 32 or n % 32 or (group_size != -1 and k % group_size):
                raise ValueError(f"{name}: int4 needs in/out features multiples of 32 and of the group size"
                                 f" ({group_size}); got [{n}, {k}]")
            perm = None
            if scheme == "gptq_act_order":
                # GPTQ orders input rows by the Hessian diagonal (activation energy), largest first;
                # without calibration data the weight column energy stands in for it.
                perm = torch.argsort(-(w.double() ** 2).sum(dim=0), stable=True)
            q = quantize_int4(w, group_size, sym=scheme != "awq", perm=perm)
            packed = q.awq() if scheme == "awq" else q.gptq()
            tensors.update({f"{prefix}.{part}": t for part, t in packed.items()})
            out.dequantized[name] = q.dequantized.t().contiguous()
        elif scheme == "w8a8_int8":
            i8 = quantize_int8_channel(w)
            tensors.update({f"{prefix}.weight": i8.weight, f"{prefix}.weight_scale": i8.weight_scale})
            out.dequantized[name] = i8.dequantized
        else:
            f8 = quantize_block_fp8(w, FP8_BLOCK)
            tensors.update({f"{prefix}.weight": f8.weight, f"{prefix}.weight_scale_inv": f8.weight_scale_inv})
            out.dequantized[name] = f8.dequantized
    if scheme in ("gptq", "gptq_act_order"):
        out.quantization_config = _gptq_config(group_size, scheme == "gptq_act_order")
    elif scheme == "awq":
        out.quantization_config = _awq_config(group_size)
    elif scheme == "w8a8_int8":
        out.quantization_config = _w8a8_config(list(ignore))
    else:
        out.quantization_config = _fp8_block_config()
    return out


def write_quantized(src: Path, dst: Path, scheme: Scheme, group_size: int = 128,
                    modules: Iterable[str] | None = None) -> QuantizedCheckpoint:
    """Copy the model folder ``src`` (config.json + model.safetensors) to ``dst``, quantized.

    Every other file (tokenizer, generation config …) is copied as it is; config.json gains
    the ``quantization_config``.
    """
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and item.name not in ("model.safetensors", "config.json"):
            shutil.copy2(item, dst / item.name)
    state = load_file(str(src / "model.safetensors"))
    ckpt = quantize_state_dict(state, scheme, group_size, modules)
    save_file({k: v.contiguous() for k, v in ckpt.tensors.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config["quantization_config"] = ckpt.quantization_config
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return ckpt
