"""RoPE family: rotary position embedding of query and key, neox and GPT-J styles.

What goes wrong on new hardware: positions held in a narrow integer type (int16 wraps past
32767, so long-context cases use positions up to 128k), cos/sin taken from a low-precision
cache or computed from low-precision angles (at position 100k a bf16 angle is off by
hundreds of radians), neox and GPT-J pairings swapped, partial rotary (rotary_dim <
head_size) rotating the whole head, non-power-of-two head sizes (80, 96, 120, 192) on a
separate code path, GQA (different query and key head counts) and single-token calls.

The cos/sin cache is built here the way vLLM builds it (angles and cos/sin in float32) and
handed to the op as float32, as vLLM keeps it; the reference rotates with exactly those
cache values, so the check is about the kernel, not about how the cache was made.

The torch implementation (``native``) is written the way a model's native path does it
(vLLM ``forward_native``): cos/sin are gathered from the float32 cache by position, the
rotary part of each head is rotated in float32 and written back into query and key in place
(vLLM's kernels rotate in place too); the tail of a partial rotary is never touched.

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from pydantic import Field, model_validator

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import rope as ref


class RopeCase(CaseBase):
    """RoPE on ``num_tokens`` tokens of query ``[T, Hq*D]`` and key ``[T, Hk*D]``."""

    num_tokens: int = Field(ge=1, description="Tokens T.")
    num_q_heads: int = Field(ge=1, description="Query heads Hq.")
    num_kv_heads: int = Field(ge=1, description="Key heads Hk (GQA: fewer than Hq).")
    head_size: int = Field(ge=2, description="Head dimension D.")
    rotary_dim: int | None = Field(default=None, ge=2,
                                   description="Rotated part of each head (even, ≤ D); None: the whole head.")
    is_neox: bool = Field(default=True, description="neox (rotate halves) or GPT-J (rotate interleaved pairs).")
    max_position: int = Field(default=4096, ge=1,
                              description="Rows of the cos/sin cache; positions are drawn below it and the "
                                          "largest one (max_position - 1) is always among them.")
    base: float = Field(default=10000.0, gt=1.0, description="RoPE base θ.")
    heads_axis: bool = Field(default=False, description="Pass query and key as [T, H, D], one axis per head, as "
                             "DeepSeek's MLA attention hands its rope parts to the rotary kernel (q_pe [T, H, 64], "
                             "k_pe [T, 1, 64]); a kernel that indexes only [T, H*D] rows rotates them wrongly.")

    @model_validator(mode="after")
    def _shapes(self) -> RopeCase:
        rd = self.rotary
        if rd % 2 or rd > self.head_size:
            raise ValueError(f"rotary_dim {rd} must be even and at most head_size {self.head_size}")
        return self

    @property
    def rotary(self) -> int:
        return self.rotary_dim if self.rotary_dim is not None else self.head_size

    def work(self) -> float:
        # ~6 flops per rotated element, plus host work per element (drawing, converting to
        # float64, comparing: ~50 reference-flop equivalents); the memoized cache is only
        # copied and converted.
        elements = self.num_tokens * (self.num_q_heads + self.num_kv_heads) * self.head_size
        rotated = self.num_tokens * (self.num_q_heads + self.num_kv_heads) * self.rotary
        return 6.0 * rotated + 50.0 * elements + 10.0 * self.max_position * self.rotary

    def scaled(self, factor: float) -> RopeCase:
        # Fewer tokens; the positions (max_position), head layout and style are the point.
        return self.model_copy(update={"num_tokens": max(1, int(self.num_tokens * max(factor, 0.0)))})


def cos_sin_cache(max_position: int, rotary_dim: int, base: float) -> torch.Tensor:
    """``[max_position, rotary_dim]`` float32: cos of all frequencies, then sin (vLLM's layout).

    Computed in float32 like vLLM's ``RotaryEmbedding._compute_cos_sin_cache``. A fresh copy
    of a memoized table: a 128k-row cache is the slowest part of making a case, and every
    dtype and seed of a case uses the same one.
    """
    return _cos_sin_cache(max_position, rotary_dim, base).clone()


@lru_cache(maxsize=2)
def _cos_sin_cache(max_position: int, rotary_dim: int, base: float) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    t = torch.arange(max_position, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def draw_positions(num_tokens: int, max_position: int, gen: torch.Generator) -> torch.Tensor:
    """``[T]`` int64 positions below ``max_position``; the last token sits at the largest one.

    Random rather than 0..T-1 so that a batch of decode tokens from different sequences is
    modelled, and the top of the cache (where narrow position types wrap) is always read.
    """
    positions = torch.randint(0, max_position, (num_tokens,), generator=gen, dtype=torch.int64)
    positions[-1] = max_position - 1
    return positions


def _rope_inputs(case: RopeCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    t, d = case.num_tokens, case.head_size
    query = torch.randn((t, case.num_q_heads * d), generator=gen, dtype=torch.float32).to(tdt)
    key = torch.randn((t, case.num_kv_heads * d), generator=gen, dtype=torch.float32).to(tdt)
    positions = draw_positions(t, case.max_position, gen)
    if case.heads_axis:
        query, key = query.view(t, case.num_q_heads, d), key.view(t, case.num_kv_heads, d)
    return OpInputs(
        {"positions": positions, "query": query, "key": key,
         "cos_sin_cache": cos_sin_cache(case.max_position, case.rotary, case.base),
         "head_size": d, "is_neox": case.is_neox},
        notes={"style": "neox" if case.is_neox else "gptj", "rotary_dim": case.rotary,
               "max_position": int(positions.max()), "gqa": f"{case.num_q_heads}/{case.num_kv_heads}",
               "needs_more_than_int16": bool(positions.max() > 2**15 - 1),
               "cache_dtype": "float32", "layout": "[T, H, D]" if case.heads_axis else "[T, H*D]"},
    )


# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


def _rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, is_neox: bool) -> torch.Tensor:
    """Rotate ``x: [T, H*D]`` (or ``[T, H, D]``) in place with ``cos, sin: [T, rotary_dim/2]`` (float32)."""
    tokens = x.shape[0]
    heads = x.view(tokens, -1, head_size)
    rotary_dim = 2 * cos.shape[-1]
    rot = heads[..., :rotary_dim].float()
    c, s = cos[:, None, :], sin[:, None, :]
    if is_neox:
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    heads[..., :rotary_dim] = out.to(x.dtype)
    return x


def rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
         head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache.index_select(0, positions).float().chunk(2, dim=-1)
    return _rotate_(query, cos, sin, head_size, is_neox), _rotate_(key, cos, sin, head_size, is_neox)


# Tolerance: the outputs are compared with the ``reduction`` class (max|Δ| / max|ref| plus
# cosine), not element-wise. A correct bf16/fp16 kernel (vLLM's CUDA kernel computes
# ``x*cos - y*sin`` with each product rounded to the dtype and reads cos/sin from a cache
# cast to the dtype) makes errors of a few ULPs of |x|, |y|; where the result cancels to
# near zero that is far above atol 1e-3 (an in-dtype kernel like that, over 5 seeds of the
# test cases: 7.5× the element-wise limit in bf16, 1.6× in fp16; 0.35–0.4× of this class),
# while the defects RoPE kernels really have (wrong pairing, wrong angles, wrapped
# positions, whole-head rotation) are off by the size of the values themselves.
OPS = [
    OpDef(
        name="rope", family="rope",
        description="Rotary position embedding of query and key (neox or GPT-J style, partial rotary), in place.",
        signature=("rope(positions: [T] int64, query: [T, Hq*D], key: [T, Hk*D], cos_sin_cache: [max_pos, "
                   "rotary_dim] float32 (cos half then sin half), head_size: int, is_neox: bool) -> "
                   "(query_out: [T, Hq*D], key_out: [T, Hk*D]); may rotate query and key in place; query and key "
                   "may also come as [T, H, D] (case heads_axis), outputs in the same shape"),
        case_model=RopeCase, make_inputs=_rope_inputs, reference=ref.rope, native=rope,
        outputs=("query_out", "key_out"), tolerance=("reduction", "reduction"),
        in_place=True,
    ),
]

__all__ = ["OPS", "RopeCase", "cos_sin_cache", "draw_positions"]
