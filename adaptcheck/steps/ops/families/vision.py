"""Vision family: the operators of a vision-language model's image path (Qwen2-VL style).

* ``encoder_attention``: the ViT's attention over several images packed in one sequence and
  delimited by ``cu_seqlens``: bidirectional inside an image, nothing across images.
  What goes wrong: a causal mask left on (decoder attention reused), ``cu_seqlens`` ignored
  (images attend to each other), segment boundaries off by one, GQA head mapping. Images
  get value offsets of alternating sign (±``IMAGE_VALUE_OFFSET``), so attention that leaks
  into a neighbouring image moves its output by about that much.
* ``patch_embed``: Qwen2-VL's PatchEmbed, a Conv3d with stride = kernel over patches that
  the processor flattened in (channel, frame, row, column) order. What goes wrong: the
  flatten order read as (frame, channel, …), a kernel stored in another layout, the bias
  (Qwen3-VL has one) dropped. Image cases repeat the frame (as the processor does for still
  images), video cases have two different frames; odd patch counts.
* ``mrope``: multimodal RoPE on the language model's query and key. Positions are ``[3, T]``
  (temporal, height, width), laid out as a prompt with an image (or video) in the middle:
  text tokens have three equal positions, image tokens their frame / row / column offsets,
  and the text after the image continues after the image's largest position (Qwen2-VL's
  ``get_rope_index``). What goes wrong: height and width sections swapped, the temporal row
  used for every frequency (plain 1-D RoPE: exact on text, wrong on every image token),
  chunked sections where the model interleaves them (Qwen3-VL) and the reverse.
* ``vision_rope_2d``: the ViT's own 2-D RoPE: the first quarter of each head's frequencies
  rotate by the patch's row, the second by its column, patches ordered by 2×2 merge window
  as the ViT orders them (the order is the input's: the op receives each patch's row and
  column). What goes wrong: row and column swapped, the frequencies of both axes taken from
  one of them.

The torch implementations (``native``) are the paths a model takes without vLLM: one SDPA
call with a block-diagonal mask (Hugging Face's Qwen2-VL sdpa path builds that mask), the
``nn.Conv3d`` of Hugging Face's PatchEmbed, and cos/sin gathered per axis and rotated in
float32 for both RoPEs.

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.families.attention import ELEMENT_COST, HeadsCase
from adaptcheck.steps.ops.families.rope import cos_sin_cache
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import vision as ref

IMAGE_VALUE_OFFSET = 2.0
"""Values of image b are N(0, 1) + (−1)^b · this: a token that reads a neighbouring image is
pulled ~2·this away from its own image's mean (real values are O(1))."""


# ------------------------------------------------------------------------------ encoder_attention


class EncoderAttentionCase(HeadsCase):
    """Bidirectional attention inside each of ``image_tokens`` images packed in one sequence."""

    image_tokens: list[int] = Field(min_length=1, description="Patches per image, in packing order "
                                                              "(cu_seqlens = their running sums).")

    @model_validator(mode="after")
    def _positive(self) -> EncoderAttentionCase:
        if min(self.image_tokens) < 1:
            raise ValueError("every image needs at least one token")
        return self

    def work(self) -> float:
        pairs = sum(n * n for n in self.image_tokens)
        elements = sum(self.image_tokens) * (2 * self.num_q_heads + 2 * self.num_kv_heads) * self.head_size
        return pairs * self.num_q_heads * (4.0 * self.head_size + 5.0) + ELEMENT_COST * elements

    def scaled(self, factor: float) -> EncoderAttentionCase:
        # Heads first, then every image shrinks alike (work ~ n²); the number of images stays.
        heads, rest = self.fewer_heads(max(factor, 0.0))
        shrink = math.sqrt(min(1.0, rest))
        return self.model_copy(update={**heads, "image_tokens": [max(1, int(n * shrink)) for n in self.image_tokens]})


def _encoder_attention_inputs(case: EncoderAttentionCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    t, d, g = sum(case.image_tokens), case.head_size, case.qk_gain
    q = (torch.randn(t, case.num_q_heads, d, generator=gen) * g).to(tdt)
    k = (torch.randn(t, case.num_kv_heads, d, generator=gen) * g).to(tdt)
    offsets = torch.cat([torch.full((n,), IMAGE_VALUE_OFFSET * (-1) ** b) for b, n in enumerate(case.image_tokens)])
    v = (torch.randn(t, case.num_kv_heads, d, generator=gen) + offsets[:, None, None]).to(tdt)
    cu = torch.tensor([0, *torch.tensor(case.image_tokens).cumsum(0).tolist()], dtype=torch.int32)
    return OpInputs({"q": q, "k": k, "v": v, "cu_seqlens": cu, "scale": case.softmax_scale},
                    notes={"images": len(case.image_tokens), "tokens": t, "largest_image": max(case.image_tokens),
                           "gqa": f"{case.num_q_heads}/{case.num_kv_heads}", "scale": case.softmax_scale,
                           "logit_std": case.logit_std, "image_value_offset": IMAGE_VALUE_OFFSET})


def encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                      scale: float) -> torch.Tensor:
    hq = q.shape[1]
    group = hq // k.shape[1]
    # Token i may read token j only inside one image: equal segment ids.
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    segment = torch.repeat_interleave(torch.arange(lens.shape[0], device=q.device), lens.to(q.device))
    mask = segment[:, None] == segment[None, :]
    kk = k.repeat_interleave(group, dim=1) if group > 1 else k
    vv = v.repeat_interleave(group, dim=1) if group > 1 else v
    out = F.scaled_dot_product_attention(q.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1),
                                         attn_mask=mask, scale=scale)
    return out.transpose(0, 1).contiguous()


# ------------------------------------------------------------------------------ patch_embed


class PatchEmbedCase(CaseBase):
    """``num_patches`` flattened pixel patches → ``embed_dim`` through a stride = kernel Conv3d."""

    num_patches: int = Field(ge=1, description="Patches N (rows of pixel_values).")
    embed_dim: int = Field(ge=1, description="Embedding width E (Qwen2-VL 1280, Qwen3-VL 1152).")
    in_channels: int = Field(default=3, ge=1, description="Channels C.")
    temporal_patch_size: int = Field(default=2, ge=1, description="Frames per patch T.")
    patch_size: int = Field(default=14, ge=1, description="Patch side P (Qwen2-VL 14, Qwen3-VL 16).")
    bias: bool = Field(default=False, description="The Conv3d has a bias (Qwen3-VL) or not (Qwen2-VL).")
    video: bool = Field(default=False, description="Frames of a patch differ (video); False: the frame is "
                                                   "repeated T times, as the processor does for a still image.")

    @property
    def patch_values(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    def work(self) -> float:
        k = self.patch_values
        return 2.0 * self.num_patches * self.embed_dim * k + ELEMENT_COST * k * (self.num_patches + self.embed_dim)

    def scaled(self, factor: float) -> PatchEmbedCase:
        # Fewer patches (kept odd where they were), then a narrower embedding; the patch shape is the point.
        factor = max(factor, 0.0)
        n = max(1, int(self.num_patches * min(1.0, factor)))
        if self.num_patches % 2 and n % 2 == 0:
            n = max(1, n - 1)
        rest = factor * self.num_patches / n
        return self.model_copy(update={"num_patches": n, "embed_dim": max(1, int(self.embed_dim * min(1.0, rest)))})


def _patch_embed_inputs(case: PatchEmbedCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    n, c, t, p = case.num_patches, case.in_channels, case.temporal_patch_size, case.patch_size
    # Normalized pixels (mean/std per channel) are O(1); a per-channel shift as CLIP's
    # normalization leaves keeps channels distinguishable.
    frames = torch.randn(n, c, t, p, p, generator=gen) + torch.linspace(-0.5, 0.5, c)[None, :, None, None, None]
    if not case.video:
        frames = frames[:, :, :1].expand(n, c, t, p, p)
    pixels = frames.reshape(n, case.patch_values).to(tdt)
    weight = (torch.randn(case.embed_dim, c, t, p, p, generator=gen) / math.sqrt(case.patch_values)).to(tdt)
    bias = (torch.randn(case.embed_dim, generator=gen) * 0.5).to(tdt) if case.bias else None
    return OpInputs({"pixel_values": pixels, "weight": weight, "bias": bias},
                    notes={"patches": n, "kernel": [t, p, p], "bias": case.bias,
                           "frames": "distinct (video)" if case.video else "repeated (image)"})


def patch_embed(pixel_values: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    e, c, t, p, _ = weight.shape
    n = pixel_values.shape[0]
    return F.conv3d(pixel_values.view(n, c, t, p, p), weight, bias, stride=(t, p, p)).view(n, e)


# ------------------------------------------------------------------------------ mrope


class MropeCase(CaseBase):
    """M-RoPE of a prompt: text, an image or video of ``grid_thw`` LLM tokens, text."""

    num_q_heads: int = Field(ge=1, description="Query heads Hq.")
    num_kv_heads: int = Field(ge=1, description="Key heads Hk.")
    head_size: int = Field(default=128, ge=2, description="Head dimension D.")
    rotary_dim: int | None = Field(default=None, ge=2, description="Rotated part of each head; None: all of it.")
    mrope_section: list[int] = Field(default=[16, 24, 24], min_length=3, max_length=3,
                                     description="Frequencies per axis (temporal, height, width); sum rotary_dim/2.")
    interleaved: bool = Field(default=False, description="Qwen3-VL interleaved sections (THWTHW…) instead of chunks.")
    text_before: int = Field(default=5, ge=0, description="Text tokens before the image.")
    grid_thw: list[int] = Field(default=[1, 4, 6], min_length=3, max_length=3,
                                description="The image's LLM tokens: frames, rows, columns (after 2×2 merge).")
    temporal_stride: int = Field(default=1, ge=0, description="Temporal position step per frame (Qwen2.5-VL video: "
                                                              "tokens_per_second × seconds per frame group).")
    text_after: int = Field(default=3, ge=0, description="Text tokens after the image.")
    start: int = Field(default=0, ge=0, description="Position of the first token (earlier context).")
    max_position: int = Field(default=4096, ge=1, description="Rows of the cos/sin cache.")
    base: float = Field(default=1000000.0, gt=1.0, description="RoPE base θ (Qwen2-VL 1e6).")

    @model_validator(mode="after")
    def _shapes(self) -> MropeCase:
        rd = self.rotary
        if rd % 2 or rd > self.head_size:
            raise ValueError(f"rotary_dim {rd} must be even and at most head_size {self.head_size}")
        if sum(self.mrope_section) != rd // 2 or min(self.mrope_section) < 0:
            raise ValueError(f"mrope_section {self.mrope_section} must add up to rotary_dim/2 = {rd // 2}")
        if min(self.grid_thw) < 1:
            raise ValueError("grid_thw needs at least one frame, row and column")
        if int(mrope_positions(self).max()) >= self.max_position:
            raise ValueError(f"positions reach past max_position {self.max_position}")
        return self

    @property
    def rotary(self) -> int:
        return self.rotary_dim if self.rotary_dim is not None else self.head_size

    @property
    def num_tokens(self) -> int:
        t, h, w = self.grid_thw
        return self.text_before + t * h * w + self.text_after

    def work(self) -> float:
        elements = self.num_tokens * (self.num_q_heads + self.num_kv_heads) * self.head_size
        return 56.0 * elements + 10.0 * self.max_position * self.rotary

    def scaled(self, factor: float) -> MropeCase:
        # Fewer heads; the prompt layout (text, image, text) is the point.
        keep = max(factor, 0.0)
        return self.model_copy(update={"num_q_heads": max(1, int(self.num_q_heads * keep)),
                                       "num_kv_heads": max(1, int(self.num_kv_heads * keep))})


def mrope_positions(case: MropeCase) -> torch.Tensor:
    """``[3, T]`` int64 positions of the case's prompt, as Qwen2-VL's get_rope_index lays them out."""
    t, h, w = case.grid_thw
    before = torch.arange(case.text_before, dtype=torch.int64) + case.start
    base = case.start + case.text_before
    frame = torch.arange(t).repeat_interleave(h * w) * case.temporal_stride
    row = torch.arange(h).repeat_interleave(w).repeat(t)
    col = torch.arange(w).repeat(t * h)
    image = torch.stack((frame, row, col)) + base
    after = torch.arange(case.text_after, dtype=torch.int64) + int(image.max()) + 1
    return torch.cat((before.expand(3, -1), image, after.expand(3, -1)), dim=1)


def _mrope_inputs(case: MropeCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    n, d = case.num_tokens, case.head_size
    query = torch.randn(n, case.num_q_heads * d, generator=gen).to(tdt)
    key = torch.randn(n, case.num_kv_heads * d, generator=gen).to(tdt)
    positions = mrope_positions(case)
    image = slice(case.text_before, n - case.text_after)
    return OpInputs(
        {"positions": positions, "query": query, "key": key,
         "cos_sin_cache": cos_sin_cache(case.max_position, case.rotary, case.base), "head_size": d,
         "mrope_section": torch.tensor(case.mrope_section, dtype=torch.int64), "interleaved": case.interleaved},
        notes={"tokens": n, "image_tokens": image.stop - image.start, "max_position": int(positions.max()),
               "mrope_section": case.mrope_section, "layout": "interleaved" if case.interleaved else "chunked",
               "rotary_dim": case.rotary, "gqa": f"{case.num_q_heads}/{case.num_kv_heads}"})


def mrope_axes(half: int, mrope_section: list[int], interleaved: bool, device: torch.device) -> torch.Tensor:
    """``[half]`` int64: the position row (0 t, 1 h, 2 w) each frequency reads."""
    s_t, s_h, s_w = mrope_section
    i = torch.arange(half, device=device)
    if not interleaved:
        return (i >= s_t).long() + (i >= s_t + s_h).long()
    return torch.where((i % 3 == 1) & (i < 3 * s_h), 1, torch.where((i % 3 == 2) & (i < 3 * s_w), 2, 0))


def rotate_neox_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int) -> torch.Tensor:
    """Rotate ``x: [T, H*D]`` in place (neox pairs) with float32 ``cos, sin: [T, rotary_dim/2]``."""
    heads = x.view(x.shape[0], -1, head_size)
    half = cos.shape[-1]
    rot = heads[..., :2 * half].float()
    a, b = rot[..., :half], rot[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    heads[..., :2 * half] = torch.cat((a * c - b * s, b * c + a * s), dim=-1).to(x.dtype)
    return x


def mrope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
          head_size: int, mrope_section: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    half = cos_sin_cache.shape[1] // 2
    axes = mrope_axes(half, [int(s) for s in mrope_section.tolist()], interleaved, positions.device)
    # Each frequency i reads the cache row of its axis' position: row positions[axes[i]], column i.
    rows = positions.index_select(0, axes)                                   # [half, T]
    cols = torch.arange(half, device=positions.device)[:, None]
    cos = cos_sin_cache[rows, cols].t().float()
    sin = cos_sin_cache[rows, cols + half].t().float()
    return rotate_neox_(query, cos, sin, head_size), rotate_neox_(key, cos, sin, head_size)


# ------------------------------------------------------------------------------ vision_rope_2d


class VisionRopeCase(CaseBase):
    """The ViT's 2-D RoPE on the patches of images of ``grids`` (frames, rows, columns in patches)."""

    grids: list[list[int]] = Field(min_length=1, description="[t, h, w] patches per image; h and w multiples of "
                                                             "spatial_merge_size.")
    num_heads: int = Field(ge=1, description="Heads H.")
    head_size: int = Field(default=80, ge=4, description="Head dimension D (multiple of 4; Qwen2-VL 80).")
    spatial_merge_size: int = Field(default=2, ge=1, description="Merge window side (patches are ordered by window).")
    base: float = Field(default=10000.0, gt=1.0, description="RoPE base θ of the ViT.")

    @model_validator(mode="after")
    def _shapes(self) -> VisionRopeCase:
        m = self.spatial_merge_size
        if self.head_size % 4:
            raise ValueError(f"head_size {self.head_size} must be a multiple of 4")
        for g in self.grids:
            if len(g) != 3 or min(g) < 1 or g[1] % m or g[2] % m:
                raise ValueError(f"grid {g}: [t, h, w] with h, w multiples of {m}")
        return self

    @property
    def num_patches(self) -> int:
        return sum(t * h * w for t, h, w in self.grids)

    def work(self) -> float:
        return 2 * 56.0 * self.num_patches * self.num_heads * self.head_size

    def scaled(self, factor: float) -> VisionRopeCase:
        return self.model_copy(update={"num_heads": max(1, int(self.num_heads * max(factor, 0.0)))})


def vision_positions(case: VisionRopeCase) -> torch.Tensor:
    """``[N, 2]`` (row, column) per patch, in the ViT's order: 2×2 merge windows row by row."""
    m = case.spatial_merge_size
    out = []
    for t, h, w in case.grids:
        rows = torch.arange(h)[:, None].expand(h, w)
        cols = torch.arange(w)[None, :].expand(h, w)
        pair = torch.stack((rows, cols), dim=-1).reshape(h // m, m, w // m, m, 2).permute(0, 2, 1, 3, 4)
        out.append(pair.reshape(-1, 2).repeat(t, 1))
    return torch.cat(out)


def _vision_rope_inputs(case: VisionRopeCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    n, h, d = case.num_patches, case.num_heads, case.head_size
    q = torch.randn(n, h, d, generator=gen).to(tdt)
    k = torch.randn(n, h, d, generator=gen).to(tdt)
    grid_max = max(max(g[1], g[2]) for g in case.grids)
    return OpInputs({"q": q, "k": k, "pos_ids": vision_positions(case),
                     "cos_sin_cache": cos_sin_cache(grid_max, d // 2, case.base)},
                    notes={"patches": n, "images": len(case.grids), "largest_grid": grid_max})


def vision_rope_2d(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                   cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    quarter = cos_sin_cache.shape[1] // 2
    cs = cos_sin_cache.float()
    cos = torch.cat((cs[pos_ids[:, 0], :quarter], cs[pos_ids[:, 1], :quarter]), dim=-1)
    sin = torch.cat((cs[pos_ids[:, 0], quarter:], cs[pos_ids[:, 1], quarter:]), dim=-1)
    n, h, d = q.shape
    return (rotate_neox_(q.reshape(n, h * d), cos, sin, d).view(n, h, d),
            rotate_neox_(k.reshape(n, h * d), cos, sin, d).view(n, h, d))


# Tolerances: attention and the patch GEMM (K = C·T·P² = 1176 for Qwen2-VL) reduce, so the
# reduction class; both RoPEs use it too, for the reason given in rope.py (a correct kernel
# rotating in the model dtype makes errors of a few ULPs where values cancel).
OPS = [
    OpDef(
        name="encoder_attention", family="vision",
        description="ViT attention: bidirectional inside each image of a packed sequence (cu_seqlens), none across.",
        signature=("encoder_attention(q: [T, Hq, D], k: [T, Hk, D], v: [T, Hk, D], cu_seqlens: [B+1] int32, "
                   "scale: float) -> out: [T, Hq, D]"),
        case_model=EncoderAttentionCase, make_inputs=_encoder_attention_inputs, reference=ref.encoder_attention,
        native=encoder_attention, outputs=("out",), tolerance=("reduction",),
    ),
    OpDef(
        name="patch_embed", family="vision",
        description="Qwen2-VL PatchEmbed: a stride = kernel Conv3d over flattened (C, T, P, P) pixel patches.",
        signature=("patch_embed(pixel_values: [N, C*T*P*P] (each row flattened in C, T, P, P order), "
                   "weight: [E, C, T, P, P], bias: [E] or None) -> out: [N, E]"),
        case_model=PatchEmbedCase, make_inputs=_patch_embed_inputs, reference=ref.patch_embed,
        native=patch_embed, outputs=("out",), tolerance=("reduction",),
    ),
    OpDef(
        name="mrope", family="vision",
        description="Multimodal RoPE (M-RoPE): frequencies split by temporal/height/width positions, neox style.",
        signature=("mrope(positions: [3, T] int64 (t, h, w), query: [T, Hq*D], key: [T, Hk*D], cos_sin_cache: "
                   "[max_pos, rotary_dim] float32 (cos half then sin half), head_size: int, mrope_section: [3] "
                   "int64, interleaved: bool) -> (query_out, key_out); may rotate in place"),
        case_model=MropeCase, make_inputs=_mrope_inputs, reference=ref.mrope, native=mrope,
        outputs=("query_out", "key_out"), tolerance=("reduction", "reduction"), in_place=True,
    ),
    OpDef(
        name="vision_rope_2d", family="vision",
        description="The ViT's 2-D RoPE: a quarter of the frequencies by patch row, a quarter by column (neox).",
        signature=("vision_rope_2d(q: [N, H, D], k: [N, H, D], pos_ids: [N, 2] int64 (row, column), "
                   "cos_sin_cache: [G, D/2] float32 (cos of D/4 frequencies, then sin)) -> (q_out, k_out); "
                   "may rotate in place"),
        case_model=VisionRopeCase, make_inputs=_vision_rope_inputs, reference=ref.vision_rope_2d,
        native=vision_rope_2d, outputs=("q_out", "k_out"), tolerance=("reduction", "reduction"), in_place=True,
    ),
]

__all__ = ["OPS", "EncoderAttentionCase", "MropeCase", "PatchEmbedCase", "VisionRopeCase", "mrope_positions",
           "vision_positions"]
