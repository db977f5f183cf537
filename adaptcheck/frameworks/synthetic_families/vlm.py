"""The embedded vision-language model: a tiny Qwen2-VL (ViT with 3-D patches, a patch-merging
projector, a 2-layer Qwen2 decoder with M-RoPE), its tokenizer with the vision special tokens,
and the processor files transformers' ``AutoProcessor`` and vLLM's processor read offline.

Why Qwen2-VL: vLLM supports it on the CPU backend, its decoder's M-RoPE (three position streams
for time, height and width, each on its own band of rotary frequencies) is the multimodal
feature a text-only model never exercises, and transformers has the reference implementation.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from adaptcheck.frameworks import synthetic as syn

if TYPE_CHECKING:
    import torch

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
"""Added after the shared 1024-id vocabulary, in this order (ids 1024..1027): only this model's
tokenizer has them, so every other embedded model keeps its bytes and its spec hash."""
TEXT_VOCAB = 1024
VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID, VIDEO_PAD_ID = range(TEXT_VOCAB, TEXT_VOCAB + len(VISION_TOKENS))
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
"""What one image is in a prompt's text; the processor widens ``<|image_pad|>`` to one pad per
merged patch (vLLM and transformers alike)."""

PATCH, TEMPORAL_PATCH, MERGE = 14, 2, 2
MIN_PIXELS = 56 * 56
"""The smallest image: 4 x 4 patches, 2 x 2 merged tokens."""
MAX_PIXELS = 28 * 28 * 64
"""At most 64 merged image tokens per image: the prompts stay short on a CPU."""
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
"""CLIP's normalisation, as published Qwen2-VL processors use."""

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or part['type'] == 'image_url' %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The shared ChatML template, with OpenAI content parts: an image part becomes one image
placeholder (string content renders exactly as the text-only models' template does)."""


def _config(spec: syn.SyntheticSpec, common: dict[str, Any]) -> dict[str, object]:
    import transformers

    half = spec.head_dim // 2
    section = list(spec.knob("mrope_section"))
    if sum(section) != half:
        raise ValueError(f"{spec.name}: mrope_section {section} must add up to head_dim / 2 = {half}")
    if spec.hidden_size // spec.num_heads != spec.head_dim:
        raise ValueError(f"{spec.name}: qwen2_vl head_dim must be hidden_size / num_heads")
    text = {k: v for k, v in common.items() if k not in ("architectures", "rope_theta", "dtype")}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": spec.rope_theta, "mrope_section": section}
    vision = {"depth": spec.knob("vision_depth"), "embed_dim": spec.knob("vision_dim"),
              "hidden_size": spec.hidden_size, "num_heads": spec.knob("vision_heads"), "mlp_ratio": 2,
              "patch_size": PATCH, "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL_PATCH,
              "in_channels": 3}
    cfg = transformers.Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=IMAGE_PAD_ID, video_token_id=VIDEO_PAD_ID,
        vision_start_token_id=VISION_START_ID, vision_end_token_id=VISION_END_ID, tie_word_embeddings=False,
    )
    data = cfg.to_diff_dict()
    data["architectures"] = [spec.architecture]
    data["dtype"] = "bfloat16"
    # Top-level copies of the text fields, as published Qwen2-VL config.json files carry them
    # (readers that look only at the top level find the decoder's shape there too).
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "rms_norm_eps", "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        data[key] = text[key]
    return data


def _layout(spec: syn.SyntheticSpec) -> list[tuple[str, tuple[int, ...], str]]:
    """Published Qwen2-VL naming (``visual.*``, ``model.*``, ``lm_head``), which transformers 5
    and vLLM both map onto their modules; the shared init finds ``model.embed_tokens`` there."""
    h, i, v, hd = spec.hidden_size, spec.intermediate_size, spec.vocab_size, spec.head_dim
    q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
    e = int(spec.knob("vision_dim"))
    merged = e * MERGE * MERGE
    out: list[tuple[str, tuple[int, ...], str]] = [
        ("visual.patch_embed.proj.weight", (e, 3, TEMPORAL_PATCH, PATCH, PATCH), "vis_linear"),
    ]
    for b in range(int(spec.knob("vision_depth"))):
        p = f"visual.blocks.{b}."
        out += [(p + "norm1.weight", (e,), "ones"), (p + "norm1.bias", (e,), "zeros"),
                (p + "norm2.weight", (e,), "ones"), (p + "norm2.bias", (e,), "zeros"),
                (p + "attn.qkv.weight", (3 * e, e), "vis_linear"), (p + "attn.qkv.bias", (3 * e,), "bias"),
                (p + "attn.proj.weight", (e, e), "vis_linear"), (p + "attn.proj.bias", (e,), "bias"),
                (p + "mlp.fc1.weight", (2 * e, e), "vis_linear"), (p + "mlp.fc1.bias", (2 * e,), "bias"),
                (p + "mlp.fc2.weight", (e, 2 * e), "vis_linear"), (p + "mlp.fc2.bias", (e,), "bias")]
    out += [("visual.merger.ln_q.weight", (e,), "ones"), ("visual.merger.ln_q.bias", (e,), "zeros"),
            ("visual.merger.mlp.0.weight", (merged, merged), "vis_linear"),
            ("visual.merger.mlp.0.bias", (merged,), "bias"),
            ("visual.merger.mlp.2.weight", (h, merged), "vis_out"), ("visual.merger.mlp.2.bias", (h,), "bias"),
            ("model.embed_tokens.weight", (v, h), "embed")]
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (h,), "ones"), (p + "post_attention_layernorm.weight", (h,), "ones"),
                (p + "self_attn.q_proj.weight", (q, h), "linear"), (p + "self_attn.k_proj.weight", (kv, h), "linear"),
                (p + "self_attn.v_proj.weight", (kv, h), "linear"), (p + "self_attn.o_proj.weight", (h, q), "linear"),
                (p + "self_attn.q_proj.bias", (q,), "bias"), (p + "self_attn.k_proj.bias", (kv,), "bias"),
                (p + "self_attn.v_proj.bias", (kv,), "bias"),
                (p + "mlp.gate_proj.weight", (i, h), "linear"), (p + "mlp.up_proj.weight", (i, h), "linear"),
                (p + "mlp.down_proj.weight", (h, i), "linear")]
    out += [("model.norm.weight", (h,), "ones"), ("lm_head.weight", (v, h), "lm_head")]
    return out


def _init(name: str, shape: tuple[int, ...], kind: str, gen: torch.Generator) -> torch.Tensor | None:
    """Vision weights at 1/sqrt(fan-in): each layer keeps unit-scale activations, so the image
    features reach the decoder at the scale of a text embedding (RMS ~1) and move its answers —
    a projector whose output is lost then changes the text, as it must for a check to see it."""
    import torch

    if kind not in ("vis_linear", "vis_out"):
        return None
    fan_in = math.prod(shape[1:])
    gain = 1.0 if kind == "vis_linear" else 1.5  # after GELU, about half the variance is left
    return torch.randn(shape, generator=gen, dtype=torch.float32) * (gain / math.sqrt(fan_in))


def _tokenizer(spec: syn.SyntheticSpec) -> dict[str, str]:
    """The shared tokenizer files (the 1024-id vocabulary) plus the vision special tokens."""
    from tokenizers import AddedToken, Tokenizer

    files = syn._tokenizer_files(replace(spec, vocab_size=TEXT_VOCAB))
    tok = Tokenizer.from_str(files["tokenizer.json"])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    for token, expected in zip(VISION_TOKENS, range(TEXT_VOCAB, spec.vocab_size), strict=True):
        if tok.token_to_id(token) != expected:
            raise RuntimeError(f"vision token {token} got id {tok.token_to_id(token)}, expected {expected}")
    config = json.loads(files["tokenizer_config.json"])
    for token, i in zip(VISION_TOKENS, range(TEXT_VOCAB, spec.vocab_size), strict=True):
        config["added_tokens_decoder"][str(i)] = {"content": token, "lstrip": False, "normalized": False,
                                                  "rstrip": False, "single_word": False, "special": True}
    config["chat_template"] = CHAT_TEMPLATE
    config["processor_class"] = "Qwen2VLProcessor"
    pixels = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
    image = {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
        **pixels, "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "patch_size": PATCH, "temporal_patch_size": TEMPORAL_PATCH, "merge_size": MERGE,
        "image_mean": list(IMAGE_MEAN), "image_std": list(IMAGE_STD), "do_resize": True, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
    }
    video = {**image, "video_processor_type": "Qwen2VLVideoProcessor"}
    del video["image_processor_type"]
    return {**files, "tokenizer.json": tok.to_str(pretty=True), "tokenizer_config.json": syn._dumps(config),
            "preprocessor_config.json": syn._dumps(image), "video_preprocessor_config.json": syn._dumps(video),
            "chat_template.json": syn._dumps({"chat_template": CHAT_TEMPLATE})}


WRITER = syn.ArchWriter(config=_config, layout=_layout, init=_init, tokenizer=_tokenizer)

TINY_QWEN2_VL = syn.register(syn.SyntheticSpec(
    name="tiny-qwen2-vl",
    architecture="Qwen2VLForConditionalGeneration",
    model_type="qwen2_vl",
    description="Qwen2-VL: ViT depth 2 (dim 64, 4 heads, 14 px patches), merger, 2-layer decoder with M-RoPE",
    hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
    vocab_size=TEXT_VOCAB + len(VISION_TOKENS),
    extra=(("chat_template", CHAT_TEMPLATE), ("max_pixels", MAX_PIXELS), ("min_pixels", MIN_PIXELS),
           ("mrope_section", (8, 12, 12)), ("vision_depth", 2), ("vision_dim", 64), ("vision_heads", 4),
           ("vision_tokens", VISION_TOKENS)),
), WRITER)
