"""A model's families (``--model`` or the ladder's model), read without loading it: config.json
through :func:`adaptcheck.base.families.read_families`, then checked against the tensor names
in the safetensors headers, so a config that contradicts its weights is named in one line
instead of certifying a family the weights do not have (docs/families.md).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from adaptcheck.base.families import UNKNOWN, FamilyReading, read_families
from adaptcheck.frameworks.modelfiles import read_config
from adaptcheck.frameworks.modelsrc import AUTO_MODEL, EMBEDDED_PREFIX, PRETRAINED_PREFIX

# Family → (what the weights of such a checkpoint always hold, as a test on one tensor name).
# Names as published checkpoints spell them: DeepSeek's kv_a_proj_with_mqa, GPTQ/AWQ qweight,
# compressed-tensors weight_packed, block fp8's weight_scale_inv …
_WEIGHT_SIGNS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "mla": ("an MLA projection (kv_a_proj_with_mqa / kv_b_proj)",
            lambda n: "kv_a_proj_with_mqa" in n or "kv_b_proj" in n),
    "moe": ("expert weights ('experts' or 'expert' in a name)", lambda n: "expert" in n),
    "multimodal": ("vision tower weights (visual / vision_tower / vision_model)",
                   lambda n: any(k in n for k in ("visual", "vision_tower", "vision_model", "vision_encoder"))),
    "hybrid": ("state-space mixer weights (A_log / conv1d / mixer)",
               lambda n: any(k in n for k in ("A_log", "conv1d", ".mixer.", "mamba"))),
    "gptq": ("packed int4 weights (qweight)", lambda n: n.endswith(".qweight")),
    "awq": ("packed int4 weights (qweight)", lambda n: n.endswith(".qweight")),
    "w4a16": ("packed int4 weights (weight_packed)", lambda n: n.endswith("weight_packed")),
    "int8_w8a8": ("weight scales (weight_scale)", lambda n: n.endswith("weight_scale")),
    "fp8": ("weight scales (weight_scale)", lambda n: n.endswith("weight_scale")),
    "fp8_block": ("block scales (weight_scale_inv / weight_scale)",
                  lambda n: n.endswith(("weight_scale_inv", "weight_scale"))),
}


def weights_contradiction(families: Collection[str], names: Collection[str]) -> str | None:
    """One line when the tensor ``names`` lack what a family of ``families`` always has; None when
    they agree (or the family has no sign to look for)."""
    for family in families:
        sign = _WEIGHT_SIGNS.get(family)
        if sign is not None and not any(sign[1](n) for n in names):
            return (f"config.json says {family} but the weights hold no {sign[0]}: the config does not describe "
                    "these weights; fix config.json or point --model at the matching folder")
    packed = any(n.endswith((".qweight", "weight_packed")) for n in names)
    if packed and not set(families) & {"gptq", "awq", "w4a16"}:
        return ("the weights are packed int4 (qweight / weight_packed) but config.json declares no int4 "
                "quantization_config: the config does not describe these weights")
    return None


def _tensor_names(folder: Path) -> list[str] | None:
    """Every tensor name in the folder's safetensors headers; None when they cannot be read."""
    from adaptcheck.frameworks.weights_audit import AuditUnavailable, UnreadableCheckpoint, read_checkpoint

    try:
        return list(read_checkpoint(folder).shapes)
    except (AuditUnavailable, UnreadableCheckpoint, ImportError, OSError):
        return None


def folder_families(folder: Path) -> FamilyReading | None:
    """The families of a local model folder; None when it has no readable config.json (the model
    check says why, where it resolves the folder). A contradiction with the weights is the
    reading's problem and makes the family unknown (every family-tagged check counts)."""
    config = read_config(folder)
    if config is None:
        return None
    reading = read_families(config)
    if reading.problem is not None:
        return reading
    names = _tensor_names(folder)
    if names is None:
        return reading
    problem = weights_contradiction(set(reading.families), names)
    if problem is None:
        return reading
    return FamilyReading((UNKNOWN,), reading.quantization, reading.evidence, problem, reading.notes)


def named_families(name: str) -> FamilyReading:
    """The families of a model *name*: an embedded variant's are declared with it; ``auto`` and
    ``pretrained:NAME`` are the dense decoders the GGUF packages ship (docs/frameworks.md)."""
    if name.startswith(EMBEDDED_PREFIX):
        from adaptcheck.frameworks.synthetic import embedded_families

        families = embedded_families(name[len(EMBEDDED_PREFIX):])
        if families:
            return FamilyReading(families, "none", (f"{name} is generated as {', '.join(families)}",))
        return FamilyReading((UNKNOWN,), "none", problem=f"no embedded model is named {name!r}")
    if name == AUTO_MODEL or name.startswith(PRETRAINED_PREFIX):
        return FamilyReading(("dense",), "none", (f"{name}: the pretrained packages hold dense decoders",))
    return folder_families(Path(name)) or FamilyReading(
        (UNKNOWN,), "none", problem=f"{name} has no readable config.json: its family is unknown")
