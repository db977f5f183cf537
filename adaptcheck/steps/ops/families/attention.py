"""Attention family: causal prefill, decode, paged decode, and the paged KV-cache write.

What goes wrong on new hardware: softmax without max subtraction overflows in fp16 once a
logit passes ~11 (``logit_std`` ≥ 4 makes that certain), causal masks off by one, GQA
heads mapped ``h % Hk`` instead of ``h // (Hq/Hk)``, the scale dropped or taken as 1/D,
sequence lengths ignored (so the garbage after them is attended: it is filled with large
values here so that any leak is loud), paged caches read through the wrong block or
offset, cache writes to the wrong slot or to slot −1 (padding), and slot / block numbers
held in narrow integers (caches here have more than 2^16 slots and the largest block and
slot numbers are always used). Head dims 64/80/96/128 and single-key cases cover the
odd-size paths.

Layouts follow vLLM's flash-attention backend: the paged cache is
``[num_blocks, block_size, Hk, D]``; ``slot = block * block_size + offset``.

The torch implementations (``native``) go through ``scaled_dot_product_attention``, the
path a model takes without custom kernels (Hugging Face's ``sdpa`` attention). GQA is done
as models do it, by repeating each kv head over its group of query heads
(``repeat_interleave``: query head h reads kv head h // group); sequence lengths become a
boolean mask; a paged cache is first gathered into contiguous per-sequence K/V through the
block tables. The cache write is an ``index_copy_`` into the flattened slots, in place.

fp8 KV caches (``paged_attention_fp8``, ``reshape_and_cache_fp8``, vLLM's ``kv_cache_dtype``
fp8_e4m3 / fp8_e5m2 with per-tensor ``k_scale`` / ``v_scale``): caches are given and returned as
fp8 codes in the catalog layout. The attention inputs are codes already (drawn, then quantized), so
the reference dequantizes exactly what the cache holds and the bound is about the kernel, not about
fp8 rounding; the scales are powers of two, so ``code · scale`` is exact in every dtype and a
provider that loads a cache through its own quantizing write stores the very same codes. What goes
wrong: the scale multiplied where it divides, K's scale used for V, a decode reading the wrong
block, fp8 formats swapped (e4m3 ↔ e5m2).

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.families.quant import current_fp8_flavour, fp8_flavour_scope, fp8_torch_dtype
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import attention as ref

GARBAGE_KEY_STD = 4.0
"""Keys that must never be read are this many times the real keys' spread: if attended they dominate."""
GARBAGE_VALUE = 512.0
"""Values that must never be read sit around this (real values are ~N(0, 1))."""
ELEMENT_COST = 50.0
"""Host work per tensor element, in reference-flop equivalents: drawing it, converting it to
float64 and comparing it cost about this much (measured ~50-130 ns per element on a 2-core
CPU against ~0.3-1 GFLOP/s of the reference GEMM probe). Counted in ``work()`` so that cases
whose size is memory rather than arithmetic (big caches) also get shrunk on slow hosts."""


class HeadsCase(CaseBase):
    """Head layout and logit scale shared by the attention cases."""

    num_q_heads: int = Field(ge=1, description="Query heads Hq.")
    num_kv_heads: int = Field(ge=1, description="Key/value heads Hk; Hq must be a multiple (GQA ratio Hq/Hk).")
    head_size: int = Field(ge=1, description="Head dimension D.")
    scale: float | None = Field(default=None, gt=0, description="Softmax scale; None: 1/sqrt(D) (what models use).")
    logit_std: float = Field(default=1.0, gt=0,
                             description="Spread of the logits scale·q·k (q and k are scaled to get it); "
                                         "≥ 4 overflows fp16 exp without max subtraction.")

    @model_validator(mode="after")
    def _gqa(self) -> HeadsCase:
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_q_heads {self.num_q_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        return self

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_size)

    @property
    def qk_gain(self) -> float:
        """Factor on N(0, 1) q and k so that scale·q·k has standard deviation ``logit_std``."""
        return math.sqrt(self.logit_std / (self.softmax_scale * math.sqrt(self.head_size)))

    def fewer_heads(self, factor: float) -> tuple[dict[str, int], float]:
        """Heads shrunk toward one kv head (GQA ratio kept) and the work factor still to take."""
        group = self.num_q_heads // self.num_kv_heads
        kv = max(1, int(self.num_kv_heads * factor))
        return {"num_q_heads": kv * group, "num_kv_heads": kv}, factor * self.num_kv_heads / kv


class PrefillCase(HeadsCase):
    """Causal self-attention over one sequence of ``num_tokens``."""

    num_tokens: int = Field(ge=1, description="Sequence length T.")

    def work(self) -> float:
        pairs = self.num_tokens * (self.num_tokens + 1) / 2
        elements = self.num_tokens * (2 * self.num_q_heads + 2 * self.num_kv_heads) * self.head_size
        return pairs * self.num_q_heads * (4.0 * self.head_size + 5.0) + ELEMENT_COST * elements

    def scaled(self, factor: float) -> PrefillCase:
        # Heads first: the sequence length is what long cases are about. Work ~ T², so T
        # takes the square root of what is left.
        heads, rest = self.fewer_heads(max(factor, 0.0))
        tokens = max(1, int(self.num_tokens * math.sqrt(min(1.0, rest))))
        return self.model_copy(update={**heads, "num_tokens": tokens})


class DecodeCase(HeadsCase):
    """One new query token per sequence against that sequence's cached keys."""

    batch: int = Field(ge=1, description="Sequences B.")
    max_seq_len: int = Field(ge=1, description="Longest sequence S; sequence 0 has this length, the others are "
                                               "random in [1, S] (sequence 1 has length 1 when B > 1).")

    def work(self) -> float:
        kv_elements = 2 * self.batch * self.max_seq_len * self.num_kv_heads * self.head_size
        return (self.batch * self.num_q_heads * self.max_seq_len * (4.0 * self.head_size + 5.0)
                + ELEMENT_COST * kv_elements)

    def scaled(self, factor: float) -> DecodeCase:
        factor = max(factor, 0.0)
        batch = max(1, int(self.batch * factor))
        heads, rest = self.fewer_heads(min(1.0, factor * self.batch / batch))
        seq = max(1, int(self.max_seq_len * min(1.0, rest)))
        return self.model_copy(update={**heads, "batch": batch, "max_seq_len": seq})


class PagedBlocks(CaseBase):
    """A paged cache's geometry for ``batch`` sequences of at most ``max_seq_len`` tokens (the
    paged attention cases here, MLA's latent cache in mla.py)."""

    batch: int
    max_seq_len: int
    block_size: int = Field(default=16, ge=1, description="Tokens per cache block.")
    num_blocks: int | None = Field(default=None, ge=1,
                                   description="Cache blocks; None: twice what the batch can need, plus one. "
                                               "The highest block number is always in use.")

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_seq_len // self.block_size)

    @property
    def total_blocks(self) -> int:
        return self.num_blocks if self.num_blocks is not None else 2 * self.batch * self.blocks_per_seq + 1

    @model_validator(mode="after")
    def _enough_blocks(self) -> PagedBlocks:
        if self.total_blocks < self.batch * self.blocks_per_seq:
            raise ValueError(f"num_blocks {self.total_blocks} < {self.batch * self.blocks_per_seq} blocks the batch may need")
        return self


class PagedCase(PagedBlocks, DecodeCase):
    """Decode attention reading K/V through block tables from a paged cache."""

    def work(self) -> float:
        # Attention over the sequences, plus the whole cache drawn and converted on the host.
        attention = self.batch * self.num_q_heads * self.max_seq_len * (4.0 * self.head_size + 5.0)
        cache = 2.0 * self.total_blocks * self.block_size * self.num_kv_heads * self.head_size
        return attention + ELEMENT_COST * cache

    def scaled(self, factor: float) -> PagedCase:
        smaller = DecodeCase.scaled(self, factor)
        return self.model_copy(update={k: getattr(smaller, k) for k in
                                       ("batch", "max_seq_len", "num_q_heads", "num_kv_heads")})


class CacheWriteCase(CaseBase):
    """reshape_and_cache: write ``num_tokens`` new K/V rows into a paged cache by slot."""

    num_tokens: int = Field(ge=1, description="Tokens T (padding included).")
    num_kv_heads: int = Field(ge=1, description="Key/value heads Hk.")
    head_size: int = Field(ge=1, description="Head dimension D.")
    block_size: int = Field(default=16, ge=1, description="Tokens per cache block.")
    num_blocks: int = Field(ge=1, description="Cache blocks; make num_blocks·block_size > 65536 to exercise "
                                              "slot numbers past 16 bits. The largest writable slot is used.")
    num_padding: int = Field(default=1, ge=0, description="Tokens with slot −1 (must not be written).")

    @model_validator(mode="after")
    def _fits(self) -> CacheWriteCase:
        if self.num_padding >= self.num_tokens:
            raise ValueError("num_padding must leave at least one real token")
        if self.num_tokens - self.num_padding > self.num_blocks * self.block_size - 1:
            raise ValueError("more real tokens than cache slots (the last slot is kept free)")
        return self

    def work(self) -> float:
        # A copy: the cost is the two caches drawn, converted and compared element by element.
        return ELEMENT_COST * 2.0 * self.num_blocks * self.block_size * self.num_kv_heads * self.head_size

    def scaled(self, factor: float) -> CacheWriteCase:
        # Fewer kv heads first, then fewer blocks, but the slot numbers stay past 16 bits when
        # they were (that is what such a case is about) and every real token keeps a slot.
        factor = max(factor, 0.0)
        kv = max(1, int(self.num_kv_heads * factor))
        rest = min(1.0, factor * self.num_kv_heads / kv)
        slots = self.num_blocks * self.block_size
        floor_slots = max(min(slots, 2**16 + 2 * self.block_size), self.num_tokens - self.num_padding + 1)
        blocks = max(-(-floor_slots // self.block_size), int(self.num_blocks * rest))
        return self.model_copy(update={"num_kv_heads": kv, "num_blocks": min(self.num_blocks, blocks)})


class Fp8CacheFields(CaseBase):
    """The fp8 cache format and its per-tensor scales."""

    kv_cache_dtype: Literal["fp8_e4m3", "fp8_e5m2"] = Field(
        default="fp8_e4m3", description="vLLM's kv_cache_dtype: fp8_e4m3 (the backend's e4m3 flavour) or fp8_e5m2.")
    k_scale: float = Field(default=0.0625, gt=0, description="Key cache scale (key = code · k_scale); a power of "
                                                             "two, so code · scale is exact in every dtype.")
    v_scale: float = Field(default=0.03125, gt=0, description="Value cache scale; a power of two, unlike k_scale "
                                                              "so that the two cannot be swapped unseen.")

    @model_validator(mode="after")
    def _powers_of_two(self) -> Fp8CacheFields:
        for name in ("k_scale", "v_scale"):
            if math.frexp(getattr(self, name))[0] != 0.5:
                raise ValueError(f"{name} must be a power of two (e.g. 0.0625), not {getattr(self, name)}")
        if self.k_scale == self.v_scale:
            raise ValueError("k_scale and v_scale must differ, else a swapped scale goes unseen")
        return self


class PagedFp8Case(Fp8CacheFields, PagedCase):
    """Paged decode attention over fp8 caches (block_size 32 by default: CPU_ATTN's fp8 kernel block)."""

    block_size: int = Field(default=32, ge=1, description="Tokens per cache block.")


class CacheWriteFp8Case(Fp8CacheFields, CacheWriteCase):
    """reshape_and_cache into fp8 caches."""

    block_size: int = Field(default=32, ge=1, description="Tokens per cache block.")


def _fp8_scope(backend: Any) -> AbstractContextManager[None]:
    """OpDef.device_scope of the fp8-cache ops: the backend's e4m3 flavour for fp8_e4m3."""
    return fp8_flavour_scope(backend.fp8_flavour)


def kv_fp8_dtype(kv_cache_dtype: str) -> torch.dtype:
    """The torch dtype of the codes in an fp8 cache (e4m3 in the flavour in effect)."""
    return torch.float8_e5m2 if kv_cache_dtype == "fp8_e5m2" else fp8_torch_dtype()


def _to_codes(x: torch.Tensor, scale: float, kv_cache_dtype: str) -> torch.Tensor:
    """x / scale clamped to the format's finite range, cast (nearest-even) to its codes."""
    fdt = kv_fp8_dtype(kv_cache_dtype)
    top = torch.finfo(fdt).max
    return (x.to(torch.float64) / scale).clamp(-top, top).to(fdt)


def _fp8_notes(case: Fp8CacheFields) -> dict[str, object]:
    flavour = current_fp8_flavour() if case.kv_cache_dtype == "fp8_e4m3" else "e5m2"
    return {"kv_cache_dtype": case.kv_cache_dtype, "fp8_format": flavour, "k_scale": case.k_scale,
            "v_scale": case.v_scale}


def _normal(shape: tuple[int, ...], gen: torch.Generator, std: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def _notes(case: HeadsCase) -> dict[str, object]:
    return {"gqa_ratio": case.num_q_heads // case.num_kv_heads, "head_size": case.head_size,
            "scale": case.softmax_scale, "logit_std": case.logit_std}


def _prefill_inputs(case: PrefillCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    t, d, g = case.num_tokens, case.head_size, case.qk_gain
    q = _normal((t, case.num_q_heads, d), gen, g).to(tdt)
    k = _normal((t, case.num_kv_heads, d), gen, g).to(tdt)
    v = _normal((t, case.num_kv_heads, d), gen).to(tdt)
    return OpInputs({"q": q, "k": k, "v": v, "scale": case.softmax_scale}, notes=_notes(case))


def draw_seq_lens(batch: int, max_seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """``[B]`` int64 lengths in [1, S]: the first is S, the second (if any) is 1."""
    lens = torch.randint(1, max_seq_len + 1, (batch,), generator=gen, dtype=torch.int64)
    lens[0] = max_seq_len
    if batch > 1:
        lens[1] = 1
    return lens


def _kv_with_garbage(case: DecodeCase, seq_lens: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 ``[B, S, Hk, D]`` keys/values, large garbage after each sequence's length."""
    shape = (case.batch, case.max_seq_len, case.num_kv_heads, case.head_size)
    k = _normal(shape, gen, case.qk_gain)
    v = _normal(shape, gen)
    beyond = torch.arange(case.max_seq_len)[None, :] >= seq_lens[:, None]  # [B, S]
    garbage_k = _normal(shape, gen, GARBAGE_KEY_STD * case.qk_gain)
    garbage_v = GARBAGE_VALUE + _normal(shape, gen, GARBAGE_VALUE / 8)
    k = torch.where(beyond[:, :, None, None], garbage_k, k)
    v = torch.where(beyond[:, :, None, None], garbage_v, v)
    return k, v


def _decode_inputs(case: DecodeCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    q = _normal((case.batch, case.num_q_heads, case.head_size), gen, case.qk_gain)
    seq_lens = draw_seq_lens(case.batch, case.max_seq_len, gen)
    k, v = _kv_with_garbage(case, seq_lens, gen)
    return OpInputs({"q": q.to(tdt), "k": k.to(tdt), "v": v.to(tdt), "seq_lens": seq_lens,
                     "scale": case.softmax_scale},
                    notes={**_notes(case), "seq_lens": seq_lens.tolist()[:16],
                           "garbage_after_seq_len": f"keys x{GARBAGE_KEY_STD}, values ~{GARBAGE_VALUE}"})


def _paged_inputs(case: PagedCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    bs, nb, per_seq = case.block_size, case.total_blocks, case.blocks_per_seq
    q = _normal((case.batch, case.num_q_heads, case.head_size), gen, case.qk_gain)
    seq_lens = draw_seq_lens(case.batch, case.max_seq_len, gen)
    # Garbage everywhere first: unused blocks and the tail of each last block keep it.
    cache_shape = (nb, bs, case.num_kv_heads, case.head_size)
    key_cache = _normal(cache_shape, gen, GARBAGE_KEY_STD * case.qk_gain)
    value_cache = GARBAGE_VALUE + _normal(cache_shape, gen, GARBAGE_VALUE / 8)
    # Every sequence gets distinct blocks in shuffled order; the highest block number is the
    # first block of sequence 0, so wide block numbers are always read.
    order = torch.randperm(nb, generator=gen)
    order = torch.cat((torch.tensor([nb - 1]), order[order != nb - 1]))
    block_tables = torch.empty((case.batch, per_seq), dtype=torch.int64)
    used = 0
    for b in range(case.batch):
        need = -(-int(seq_lens[b]) // bs)
        block_tables[b, :need] = order[used:used + need]
        used += need
        # Table entries past the sequence hold valid but arbitrary block numbers: never to be read.
        block_tables[b, need:] = torch.randint(0, nb, (per_seq - need,), generator=gen)
        length = int(seq_lens[b])
        tok = torch.arange(length)
        blocks = block_tables[b, tok // bs]
        key_cache[blocks, tok % bs] = _normal((length, case.num_kv_heads, case.head_size), gen, case.qk_gain)
        value_cache[blocks, tok % bs] = _normal((length, case.num_kv_heads, case.head_size), gen)
    return OpInputs({"q": q.to(tdt), "key_cache": key_cache.to(tdt), "value_cache": value_cache.to(tdt),
                     "block_tables": block_tables, "seq_lens": seq_lens, "scale": case.softmax_scale},
                    notes={**_notes(case), "seq_lens": seq_lens.tolist()[:16], "num_blocks": nb,
                           "block_size": bs, "max_block_id": int(block_tables.max())})


def _cache_write_inputs(case: CacheWriteCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    t, slots_total = case.num_tokens, case.num_blocks * case.block_size
    shape = (case.num_blocks, case.block_size, case.num_kv_heads, case.head_size)
    key_cache = _normal(shape, gen, 100.0).to(tdt)  # old contents: must survive where not written
    value_cache = _normal(shape, gen, 100.0).to(tdt)
    key = _normal((t, case.num_kv_heads, case.head_size), gen).to(tdt)
    value = _normal((t, case.num_kv_heads, case.head_size), gen).to(tdt)
    # Distinct, scattered slots; the last slot stays free so that a write to slot -1 (Python
    # indexing wraps it to the last slot) shows; the largest slot that is written is
    # slots_total - 2, past 2^16 when the cache is that big.
    real = t - case.num_padding
    chosen = torch.randperm(slots_total - 1, generator=gen)[:real]
    if not bool((chosen == slots_total - 2).any()):
        chosen[0] = slots_total - 2  # still distinct: that slot was not chosen
    slot_mapping = torch.full((t,), -1, dtype=torch.int64)
    real_positions = torch.randperm(t, generator=gen)[:real]
    slot_mapping[real_positions] = chosen
    return OpInputs({"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
                     "slot_mapping": slot_mapping},
                    notes={"slots": slots_total, "max_slot": int(slot_mapping.max()), "padding": case.num_padding,
                           "needs_more_than_int16": bool(slot_mapping.max() > 2**15 - 1)})



def _paged_fp8_inputs(case: PagedFp8Case, dtype: str, gen: torch.Generator) -> OpInputs:
    base = _paged_inputs(case, dtype, gen)
    kw = dict(base.kwargs)
    kw["key_cache"] = _to_codes(_as_tensor(kw["key_cache"]), case.k_scale, case.kv_cache_dtype)
    kw["value_cache"] = _to_codes(_as_tensor(kw["value_cache"]), case.v_scale, case.kv_cache_dtype)
    kw.update(kv_cache_dtype=case.kv_cache_dtype, k_scale=case.k_scale, v_scale=case.v_scale)
    return OpInputs(kw, notes={**base.notes, **_fp8_notes(case)})


def _cache_write_fp8_inputs(case: CacheWriteFp8Case, dtype: str, gen: torch.Generator) -> OpInputs:
    base = _cache_write_inputs(case, dtype, gen)
    kw = dict(base.kwargs)
    # Old contents: codes spread over the format's range (the first draw was ~N(0, 100)).
    kw["key_cache"] = _to_codes(_as_tensor(kw["key_cache"]) * case.k_scale, case.k_scale, case.kv_cache_dtype)
    kw["value_cache"] = _to_codes(_as_tensor(kw["value_cache"]) * case.v_scale, case.v_scale, case.kv_cache_dtype)
    # New rows at a spread the scales quantize across many binades (|x| / scale up to ~64).
    kw["key"] = (_as_tensor(kw["key"]).float() * 16 * case.k_scale).to(torch_dtype(dtype))
    kw["value"] = (_as_tensor(kw["value"]).float() * 16 * case.v_scale).to(torch_dtype(dtype))
    kw.update(kv_cache_dtype=case.kv_cache_dtype, k_scale=case.k_scale, v_scale=case.v_scale)
    return OpInputs(kw, notes={**base.notes, **_fp8_notes(case)})


def _as_tensor(x: object) -> torch.Tensor:
    assert isinstance(x, torch.Tensor)
    return x


def _reshape_and_cache_fp8_reference(**kwargs: Any) -> Any:
    flavour = current_fp8_flavour() if kwargs["kv_cache_dtype"] == "fp8_e4m3" else "e5m2"
    return ref.reshape_and_cache_fp8(**kwargs, e4m3_flavour=flavour)

# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


def _expand_kv(x: torch.Tensor, group: int, head_dim: int) -> torch.Tensor:
    """Repeat each kv head ``group`` times along ``head_dim`` (contiguous groups, like HF's repeat_kv)."""
    return x if group == 1 else x.repeat_interleave(group, dim=head_dim)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    qh = q.transpose(0, 1)  # [Hq, T, D]
    kh = _expand_kv(k, group, 1).transpose(0, 1)
    vh = _expand_kv(v, group, 1).transpose(0, 1)
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    return out.transpose(0, 1).contiguous()


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float) -> torch.Tensor:
    max_len = k.shape[1]
    group = q.shape[1] // k.shape[2]
    kh = _expand_kv(k, group, 2).permute(0, 2, 1, 3)  # [B, Hq, S, D]
    vh = _expand_kv(v, group, 2).permute(0, 2, 1, 3)
    visible = torch.arange(max_len, device=k.device)[None, :] < seq_lens[:, None]  # [B, S]
    out = F.scaled_dot_product_attention(q[:, :, None, :], kh, vh, attn_mask=visible[:, None, None, :], scale=scale)
    return out[:, :, 0, :]


def paged_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    batch, max_blocks = block_tables.shape
    _, block_size, num_kv_heads, head_size = key_cache.shape
    # [B, max_blocks, block_size, Hk, D] -> [B, max_blocks * block_size, Hk, D]: token i at i.
    k = key_cache[block_tables].reshape(batch, max_blocks * block_size, num_kv_heads, head_size)
    v = value_cache[block_tables].reshape(batch, max_blocks * block_size, num_kv_heads, head_size)
    return decode_attention(q, k, v, seq_lens, scale)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    real = slot_mapping >= 0  # slot -1 is padding: never written
    slots = slot_mapping[real]
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slots, key[real])
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slots, value[real])
    return key_cache, value_cache



def paged_attention_fp8(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, kv_cache_dtype: str,
                        k_scale: float, v_scale: float) -> torch.Tensor:
    # Dequantize (exact: codes times a power of two) and attend as from a model-dtype cache.
    return paged_attention(q, key_cache.to(q.dtype) * k_scale, value_cache.to(q.dtype) * v_scale, block_tables,
                           seq_lens, scale)


def reshape_and_cache_fp8(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: float,
                          v_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    # Moved as bytes: index_copy_ has no fp8 kernels, and a copy of codes is a copy of their bytes.
    byte = torch.uint8
    reshape_and_cache(_to_codes(key, k_scale, kv_cache_dtype).view(byte), _to_codes(value, v_scale, kv_cache_dtype).view(byte),
                      key_cache.view(byte), value_cache.view(byte), slot_mapping)
    return key_cache, value_cache

OPS = [
    OpDef(
        name="prefill_attention", family="attention",
        description="Causal self-attention over one sequence, grouped-query heads.",
        signature=("prefill_attention(q: [T, Hq, D], k: [T, Hk, D], v: [T, Hk, D], scale: float) -> "
                   "out: [T, Hq, D]; causal; query head h reads kv head h // (Hq // Hk)"),
        case_model=PrefillCase, make_inputs=_prefill_inputs, reference=ref.prefill_attention, native=prefill_attention,
        outputs=("out",), tolerance=("reduction",),
    ),
    OpDef(
        name="decode_attention", family="attention",
        description="One query token per sequence against its first seq_lens[b] cached keys.",
        signature=("decode_attention(q: [B, Hq, D], k: [B, S, Hk, D], v: [B, S, Hk, D], seq_lens: [B] int64, "
                   "scale: float) -> out: [B, Hq, D]; keys at index >= seq_lens[b] must be ignored"),
        case_model=DecodeCase, make_inputs=_decode_inputs, reference=ref.decode_attention, native=decode_attention,
        outputs=("out",), tolerance=("reduction",),
    ),
    OpDef(
        name="paged_attention", family="attention",
        description="Decode attention over a paged KV cache addressed through block tables.",
        signature=("paged_attention(q: [B, Hq, D], key_cache: [num_blocks, block_size, Hk, D], value_cache: "
                   "[num_blocks, block_size, Hk, D], block_tables: [B, max_blocks] int64, seq_lens: [B] int64, "
                   "scale: float) -> out: [B, Hq, D]; token i of sequence b is at block block_tables[b, i // "
                   "block_size], offset i % block_size"),
        case_model=PagedCase, make_inputs=_paged_inputs, reference=ref.paged_attention, native=paged_attention,
        outputs=("out",), tolerance=("reduction",),
    ),
    OpDef(
        name="reshape_and_cache", family="attention",
        description="Write new keys and values into the paged KV cache by slot (slot -1: padding, skipped).",
        signature=("reshape_and_cache(key: [T, Hk, D], value: [T, Hk, D], key_cache: [num_blocks, block_size, Hk, "
                   "D], value_cache: [num_blocks, block_size, Hk, D], slot_mapping: [T] int64) -> (key_cache_out, "
                   "value_cache_out); slot = block * block_size + offset; may write the caches in place"),
        case_model=CacheWriteCase, make_inputs=_cache_write_inputs, reference=ref.reshape_and_cache, native=reshape_and_cache,
        outputs=("key_cache_out", "value_cache_out"), tolerance=("exact", "exact"),
        in_place=True,
    ),
    OpDef(
        name="paged_attention_fp8", family="attention",
        description="Decode attention over fp8 paged KV caches (kv_cache_dtype fp8_e4m3 / fp8_e5m2, k_scale, v_scale).",
        signature=("paged_attention_fp8(q: [B, Hq, D], key_cache: [num_blocks, block_size, Hk, D] fp8 codes, "
                   "value_cache: same, block_tables: [B, max_blocks] int64, seq_lens: [B] int64, scale: float, "
                   "kv_cache_dtype: 'fp8_e4m3' | 'fp8_e5m2', k_scale: float, v_scale: float) -> out: [B, Hq, D]; "
                   "key = code · k_scale, value = code · v_scale; addressing as paged_attention"),
        case_model=PagedFp8Case, make_inputs=_paged_fp8_inputs, reference=ref.paged_attention_fp8,
        native=paged_attention_fp8, outputs=("out",), tolerance=("fp8_kv_attention",), requires=("fp8_e4m3",),
        device_scope=_fp8_scope,
    ),
    OpDef(
        name="reshape_and_cache_fp8", family="attention",
        description="Write new keys and values into fp8 paged KV caches by slot: code = fp8(x / scale).",
        signature=("reshape_and_cache_fp8(key: [T, Hk, D], value: [T, Hk, D], key_cache: [num_blocks, block_size, "
                   "Hk, D] fp8 codes, value_cache: same, slot_mapping: [T] int64, kv_cache_dtype: 'fp8_e4m3' | "
                   "'fp8_e5m2', k_scale: float, v_scale: float) -> (key_cache_out, value_cache_out) fp8 codes; "
                   "code = fp8(clamp(x / scale)); slot -1 skipped; may write the caches in place"),
        case_model=CacheWriteFp8Case, make_inputs=_cache_write_fp8_inputs, reference=_reshape_and_cache_fp8_reference,
        native=reshape_and_cache_fp8, outputs=("key_cache_out", "value_cache_out"),
        tolerance=("fp8_kv_cache", "fp8_kv_cache"), requires=("fp8_e4m3",), device_scope=_fp8_scope, in_place=True,
    ),
]
