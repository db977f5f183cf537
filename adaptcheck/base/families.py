"""The model families a certificate can vouch for, and how a model's config.json names its families.

"One Qwen dense model running does not mean every DeepSeek, GLM or multimodal model is
compatible" (the source article): a family is an architecture trait that runs operators and
engine paths a dense decoder never touches — latent attention, expert routing, a vision tower,
a state-space layer, a weight-quantized checkpoint. A check vouches for a family by carrying the
ladder tag ``family:<name>``. Two consequences (docs/families.md):

- The families table of ``results.json`` (schema 1.6) says per family ``certified``, ``failed``,
  ``n/a`` (with the framework's own reason) or ``not tested`` — the rule of the features table
  (:class:`~adaptcheck.base.features.TagTable`). ``adaptcheck grade --require-family`` gates on it.
- The grade of a model counts the family-tagged checks of *its* families only (the way
  ``quant:`` tags count only for their format): a broken MLA kernel does not fail a dense model,
  and does fail a DeepSeek one. A model of an unknown family counts them all (the strict reading).

:func:`read_families` reads a model's families from its config.json (plain data, no framework);
:mod:`adaptcheck.frameworks.modelfamily` checks the reading against the weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from adaptcheck.base.features import TagTable

FAMILY_TAG = "family:"

ARCH_FAMILIES: dict[str, str] = {
    "dense": "a dense decoder (attention + MLP, Llama/Qwen-style) gives the float64 answers",
    "moe": "mixture-of-experts routing (softmax top-k; grouped sigmoid top-k with bias) and shared experts",
    "mla": "multi-head latent attention (DeepSeek-V2/V3): absorbed decode, prefill and the latent KV cache",
    "multimodal": "a vision encoder, its projector and M-RoPE: image prompts answered as in float64",
    "hybrid": "state-space (Mamba2) layers beside attention: the SSM and conv state carried across steps",
}
"""Architecture families, in table order."""

QUANT_FAMILIES: dict[str, str] = {
    "gptq": "GPTQ int4 weights (group scales, zero points, act-order) dequantized and multiplied correctly",
    "awq": "AWQ int4 weights (interleaved packing, zero points) dequantized and multiplied correctly",
    "w4a16": "compressed-tensors int4 weight-only (pack-quantized) checkpoints",
    "int8_w8a8": "int8 weights and activations (compressed-tensors W8A8)",
    "fp8": "per-tensor / per-channel fp8 weights and activations",
    "fp8_block": "block-scaled fp8 weights (128x128 blocks, DeepSeek-V3 style)",
}
"""Quantized-checkpoint families: each is also a ``quant:`` format of the same name."""

FAMILIES: dict[str, str] = {**ARCH_FAMILIES, **QUANT_FAMILIES}
"""Every family a ladder may tag, with the one line the report and ``--help`` show, in table order."""

FAMILY_TABLE = TagTable("family", FAMILY_TAG, FAMILIES, required_step=4)
"""The families table's registry and rule: a family is certified only when a step-4 check of a
model of it passed (its operators passing in step 3 are evidence, not a certificate)."""

UNKNOWN = "unknown"
"""The family list of a model whose config names none this module knows: every family-tagged
check then counts towards its grade."""

Quantization = Literal["none", "int8_w8a8", "fp8", "fp8_block", "gptq", "awq", "w4a16", "other"]
QUANT_FORMATS: tuple[str, ...] = tuple(QUANT_FAMILIES)
"""Formats a check may name in a 'quant:FORMAT' tag (the quantized-checkpoint families)."""

# Model types whose layers hold a state-space (Mamba, linear-attention) mixer: configs spell the
# layer pattern in many ways (attn_layer_indices, hybrid_override_pattern, layer_types …), but the
# model type says it for every published one.
_SSM_MODEL_TYPES = frozenset({
    "mamba", "mamba2", "jamba", "bamba", "nemotron_h", "zamba", "zamba2", "falcon_h1", "falcon_mamba",
    "granitemoehybrid", "plamo2", "lfm2", "minimax", "minimax_m1", "qwen3_next", "hunyuan_v1_moe_hybrid",
})
_SSM_KEYS = ("mamba_d_state", "ssm_state_size", "mamba_n_heads", "hybrid_override_pattern", "attn_layer_indices",
             "mamba_d_conv", "ssm_cfg")
_SSM_LAYER_WORDS = ("mamba", "linear_attention", "ssm", "conv")
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_VISION_KEYS = ("vision_config", "vision_tower", "mm_vision_tower", "visual")


@dataclass(frozen=True)
class FamilyReading:
    """What one config.json says about the model's families."""

    families: tuple[str, ...]
    """Architecture families then the quantized family, in table order; ``("unknown",)`` when
    the config names no family this module knows (then :attr:`problem` says why)."""
    quantization: Quantization
    evidence: tuple[str, ...] = ()
    """Why each family was read, one phrase each ('kv_lora_rank=512 → mla')."""
    problem: str | None = None
    """One line when the family is unknown, with what to fix; None otherwise."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Readings that are not problems (a quantization method without its own format)."""


def _num(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def language_config(config: Mapping[str, object]) -> dict[str, object]:
    """``config`` with its language model's part laid over it (:func:`_text_config`): the keys a
    decoder's sizes are read from (layers, heads, context, dtype), for a multimodal model too."""
    text = _text_config(config)
    return dict(config) if text is config else {**config, **text}


def _text_config(config: Mapping[str, object]) -> Mapping[str, object]:
    """The language model's part: multimodal configs nest it under ``text_config`` (or
    ``llm_config`` / ``language_config``); a plain decoder's config is its own."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, Mapping):
            return sub
    return config


def _arch_families(config: Mapping[str, object]) -> tuple[list[str], list[str]]:
    text = _text_config(config)
    found: list[str] = []
    why: list[str] = []
    kv_lora = text.get("kv_lora_rank")
    if _num(kv_lora) > 0:
        found.append("mla")
        why.append(f"kv_lora_rank={kv_lora} → mla")
    experts = next(((k, text[k]) for k in _MOE_KEYS if _num(text.get(k)) > 1), None)
    if experts is not None:
        found.append("moe")
        why.append(f"{experts[0]}={experts[1]} → moe")
    vision = next((k for k in _VISION_KEYS if isinstance(config.get(k), (Mapping, str))), None)
    if vision is not None:
        found.append("multimodal")
        why.append(f"{vision} → multimodal")
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    layer_types = text.get("layer_types") or text.get("layers_block_type")
    ssm_layers = isinstance(layer_types, list) and any(
        isinstance(t, str) and any(w in t.lower() for w in _SSM_LAYER_WORDS) for t in layer_types)
    ssm_key = next((k for k in _SSM_KEYS if text.get(k) is not None), None)
    if model_type in _SSM_MODEL_TYPES or ssm_layers or ssm_key:
        found.append("hybrid")
        why.append(f"{'model_type=' + model_type if model_type in _SSM_MODEL_TYPES else ssm_key or 'layer_types'}"
                   " → hybrid")
    return found, why


def _quantization(config: Mapping[str, object]) -> tuple[Quantization, str | None]:
    """The checkpoint's format from ``quantization_config`` (and why, when it is 'other')."""
    quant = config.get("quantization_config")
    if quant is None:
        return "none", None
    if not isinstance(quant, Mapping):
        return "other", "quantization_config is not an object: every quantized check counts"
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits", quant.get("w_bit"))
    if method in ("fp8", "fbgemm_fp8"):
        # DeepSeek-V3's published checkpoints say fp8 with weight_block_size [128, 128]: block fp8.
        return ("fp8_block" if quant.get("weight_block_size") else "fp8"), None
    if method in ("gptq", "awq") and bits == 4:
        return ("gptq" if method == "gptq" else "awq"), None
    if method == "compressed-tensors":
        groups = quant.get("config_groups")
        kinds = {_group_kind(g) for g in groups.values()} if isinstance(groups, Mapping) else set()
        only = next(iter(kinds)) if len(kinds) == 1 else None
        if only is not None:
            return only, None
        return "other", f"compressed-tensors groups of kinds {sorted(str(k) for k in kinds)}: every quantized check counts"
    return "other", f"quant_method {method or '?'!r} ({bits} bits) has no format of its own: every quantized check counts"


def _group_kind(group: object) -> Quantization | None:
    """One compressed-tensors config group → its format (None when no format fits)."""
    if not isinstance(group, Mapping):
        return None
    w, a = group.get("weights") or {}, group.get("input_activations") or {}
    if not isinstance(w, Mapping) or not isinstance(a, Mapping):
        return None
    wbits, wtype = w.get("num_bits"), w.get("type")
    if wbits == 4 and wtype == "int" and not a:
        return "w4a16"
    if wbits == 8 and a.get("num_bits") == 8 and wtype == a.get("type"):
        if wtype == "int":
            return "int8_w8a8"
        if wtype == "float":
            return "fp8_block" if w.get("strategy") == "block" else "fp8"
    return None


def read_families(config: Mapping[str, object]) -> FamilyReading:
    """The families config.json names: architecture traits first, then the quantized format.

    A decoder with attention heads and none of the traits is ``dense``. A config with no
    architecture, or no attention/state-space shape at all, is ``unknown`` with a one-line reason.
    """
    quantization, quant_note = _quantization(config)
    found, why = _arch_families(config)
    text = _text_config(config)
    if not found:
        named = config.get("architectures") or config.get("model_type")
        if not named:
            return FamilyReading((UNKNOWN,), quantization, problem="config.json names no architecture (neither "
                                 "'architectures' nor 'model_type'): pass a Hugging Face model folder")
        if _num(text.get("num_attention_heads")) <= 0 or _num(text.get("hidden_size")) <= 0:
            arch = named[0] if isinstance(named, list) and named else named
            return FamilyReading((UNKNOWN,), quantization, problem=(
                f"the family of {arch} is unknown: its config.json has no num_attention_heads/hidden_size and none "
                "of the traits of the known families (kv_lora_rank, experts, vision_config, state-space layers); "
                "every family-tagged check counts for its grade"))
        found, why = ["dense"], ["attention heads and no other trait → dense"]
    if quantization in QUANT_FAMILIES:
        found.append(quantization)
        why.append(f"quantization_config → {quantization}")
    return FamilyReading(tuple(found), quantization, tuple(why), notes=(quant_note,) if quant_note else ())


def graded_families(tags: list[str], families: list[str]) -> bool:
    """Whether a check with ``tags`` counts for a model of ``families``: untagged checks always;
    family-tagged ones when the model is of one of them, or of an unknown family (strict)."""
    named = FAMILY_TABLE.tagged(tags)
    return not named or UNKNOWN in families or bool(set(named) & set(families))
