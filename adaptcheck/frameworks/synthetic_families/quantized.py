"""Quantized checkpoints of ``embedded:tiny-llama``, one per format a published checkpoint uses
(GPTQ, AWQ, compressed-tensors W8A8, DeepSeek-style block fp8), each written with the exact float
weights it means (docs/families.md, "Quantized checkpoints").

The packed folder is what frameworks load; its ``reference/`` subfolder holds the same model
with every quantized Linear replaced by its dequantized weight in float64 (int4 and int8 codes
times 8-bit scales, fp8 times float32 block scales: exact in float64), so the float64
reference of the quantized model is exact rather than an approximation of the checkpoint. No
EOS or stop probes of their own: a quantized copy answers slightly differently from its source,
so the source's probes do not carry over (a run skips them, as for any model without them).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptcheck.frameworks import synthetic as syn

REFERENCE_DIR = "reference"
"""The subfolder with the dequantized weights (metadata ``reference_folder``)."""

ACTIVATIONS = {"w8a8_int8": "int8_per_token"}
"""Schemes that quantize activations too (metadata ``activation_quant``): the reference applies
the same dynamic quantization to every quantized Linear's input, so it is the model the
checkpoint describes, not its unquantized cousin."""


def quantize_activations_like(model: Any, kind: str) -> int:
    """Register, on every ``*_proj`` Linear of ``model`` (the quantized ones), a pre-hook that
    quantizes its input as ``kind`` says — ``int8_per_token``: scale = max|x| / 127 per token,
    codes rounded to nearest, clamped to ±127, dequantized in the input's dtype (float64 in the
    reference). Returns how many layers got one."""
    import torch

    if kind != "int8_per_token":
        raise ValueError(f"unknown activation quantization {kind!r}")

    def fake_quant(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny) / 127
        return (torch.round(x / scale).clamp(-127, 127) * scale, *args[1:])

    count = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.endswith("_proj"):
            module.register_forward_pre_hook(fake_quant)
            count += 1
    return count


@dataclass(frozen=True)
class QuantizedSpec(syn.DerivedSpec):
    """A quantized copy of ``source`` in ``scheme`` (adaptcheck.frameworks.quant_writer.SCHEMES)."""

    scheme: str = "gptq"
    group_size: int = 128

    def write(self, source: Path, seed: int, out: Path) -> None:
        from safetensors.torch import load_file, save_file

        from adaptcheck.frameworks.quant_writer import Scheme, write_quantized

        scheme: Scheme = self.scheme  # type: ignore[assignment]  # one of SCHEMES, checked by quant_writer
        ckpt = write_quantized(source, out, scheme, self.group_size)
        (out / syn.METADATA_FILE).unlink(missing_ok=True)  # the source's, copied along: written anew last
        ref = out / REFERENCE_DIR
        ref.mkdir()
        for item in source.iterdir():
            if item.is_file() and item.name not in ("model.safetensors", syn.METADATA_FILE):
                shutil.copy2(item, ref / item.name)
        dense = load_file(str(source / "model.safetensors"))
        dense.update(ckpt.dequantized)  # float64: exact, whatever the format's scales
        save_file({k: v.contiguous() for k, v in sorted(dense.items())}, str(ref / "model.safetensors"),
                  metadata={"format": "pt"})
        source_meta = syn.synthetic_info(source) or {}
        meta = {
            **syn._identity(self, seed, ckpt.tensors),
            "num_params": source_meta.get("num_params"),  # the dense count: what the reference holds
            "eos_token_id": syn.EOS_ID,
            "quantized_from": self.source,
            "quantized_from_spec_hash": source_meta.get("spec_hash"),
            "scheme": self.scheme,
            "quantization_config": ckpt.quantization_config,
            "reference_folder": REFERENCE_DIR,
            **({"activation_quant": ACTIVATIONS[self.scheme]} if self.scheme in ACTIVATIONS else {}),
            "reference": "transformers, float64, CPU, on the dequantized weights in reference/",
        }
        (out / syn.METADATA_FILE).write_text(syn._dumps(meta))


_LLAMA = syn.EMBEDDED["tiny-llama"]

for _name, _scheme, _family in (("tiny-llama-gptq", "gptq", "gptq"), ("tiny-llama-awq", "awq", "awq"),
                                ("tiny-llama-w8a8", "w8a8_int8", "int8_w8a8"),
                                ("tiny-llama-fp8-block", "fp8_block", "fp8_block")):
    syn.register(QuantizedSpec(
        name=_name, architecture=_LLAMA.architecture, model_type=_LLAMA.model_type,
        description=f"embedded:tiny-llama quantized as {_scheme} (packed as published checkpoints are), with its"
                    " exact dequantized weights for the float64 reference",
        hidden_size=_LLAMA.hidden_size, intermediate_size=_LLAMA.intermediate_size, num_layers=_LLAMA.num_layers,
        num_heads=_LLAMA.num_heads, num_kv_heads=_LLAMA.num_kv_heads, head_dim=_LLAMA.head_dim,
        source="tiny-llama", scheme=_scheme), families=("dense", _family))
