"""Attention references in float64: causal prefill, decode, paged decode, and the KV-cache write.

Everything follows the textbook formula ``softmax(scale · q·kᵀ + mask) · v``, with the
softmax written out (max subtraction, exponentials, sum, division) rather than taken from a
library. The q·k and p·v dot products are float64 ``@`` products: the point of the reference
is the masking, the head mapping, the softmax and the cache addressing, and a float64 dot
product of a few thousand terms is exact to ~1e-13, far below any dtype's tolerance.

Conventions (vLLM's): grouped-query attention maps query head ``h`` to kv head
``h // (Hq // Hk)``; a paged cache is ``[num_blocks, block_size, Hk, D]`` and token ``i`` of
sequence ``b`` lives at ``block_tables[b, i // block_size]``, offset ``i % block_size``;
``slot_mapping[t] = block * block_size + offset``, and slot −1 marks a padding token that is
not written.

fp8 KV caches (``paged_attention_fp8``, ``reshape_and_cache_fp8``): a cache holds fp8 codes and a
per-tensor scale, ``value = code · scale``. The attention reference dequantizes exactly what the
cache holds; the cache-write reference quantizes in float64 (``x / scale``, clamped to the finite
range, rounded to nearest-even on the format's grid, built from its definition in
``reference_kernels.quant``), so that the bound is about the kernel and not about fp8 rounding.
"""

from __future__ import annotations

import numpy as np

from reference_kernels.quant import Fp8Format, fp8_format, round_to_fp8

E5M2 = Fp8Format("e5m2", bias=15, max_finite=57344.0, mantissa_bits=2)
"""OCP e5m2: 5 exponent bits, 2 mantissa bits, largest finite 1.11 x 2^15 = 57344."""


def kv_head_for(q_head: int, num_q_heads: int, num_kv_heads: int) -> int:
    """The kv head that query head ``q_head`` reads (GQA groups are contiguous)."""
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    return q_head // (num_q_heads // num_kv_heads)


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; ``-inf`` entries get weight 0 (every row needs one finite entry)."""
    row_max = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - row_max)
    return weights / weights.sum(axis=-1, keepdims=True)


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float,
           mask: np.ndarray | None = None) -> np.ndarray:
    """One head: ``q: [Tq, D]``, ``keys, values: [S, D]``, ``mask: [Tq, S]`` (True = may attend)."""
    scores = (q @ keys.T) * scale
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    return softmax_rows(scores) @ values


def prefill_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Causal self-attention of one sequence: ``q: [T, Hq, D]``, ``k, v: [T, Hk, D]`` → ``[T, Hq, D]``.

    Query token ``i`` attends to keys ``0..i`` (inclusive).
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    tokens, num_q_heads, _ = q.shape
    num_kv_heads = k.shape[1]
    out = np.empty_like(q)
    # Rows in blocks so that the [rows, T] score matrix stays small for long sequences.
    block = max(1, 2**21 // max(1, tokens))
    for h in range(num_q_heads):
        g = kv_head_for(h, num_q_heads, num_kv_heads)
        for start in range(0, tokens, block):
            rows = np.arange(start, min(tokens, start + block))
            stop = rows[-1] + 1  # keys after the last row of the block are masked anyway
            causal = np.arange(stop)[None, :] <= rows[:, None]
            out[rows, h] = attend(q[rows, h], k[:stop, g], v[:stop, g], scale, causal)
    return out


def decode_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, seq_lens: np.ndarray,
                     scale: float) -> np.ndarray:
    """One new query per sequence: ``q: [B, Hq, D]``, ``k, v: [B, S, Hk, D]`` → ``[B, Hq, D]``.

    Sequence ``b`` attends to its first ``seq_lens[b]`` keys; the rest of the row is never read.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    batch, num_q_heads, _ = q.shape
    num_kv_heads = k.shape[2]
    out = np.empty_like(q)
    for b in range(batch):
        length = int(seq_lens[b])
        if not 1 <= length <= k.shape[1]:
            raise ValueError(f"seq_lens[{b}] = {length} outside [1, {k.shape[1]}]")
        for h in range(num_q_heads):
            g = kv_head_for(h, num_q_heads, num_kv_heads)
            out[b, h] = attend(q[b, h][None, :], k[b, :length, g], v[b, :length, g], scale)[0]
    return out


def gather_paged(cache: np.ndarray, block_table_row: np.ndarray, length: int) -> np.ndarray:
    """Tokens ``0..length-1`` of one sequence out of a paged cache → ``[length, Hk, D]``."""
    block_size = cache.shape[1]
    token = np.arange(length)
    blocks = np.asarray(block_table_row, dtype=np.int64)[token // block_size]
    if blocks.size and (blocks.min() < 0 or blocks.max() >= cache.shape[0]):
        raise ValueError(f"block table points outside the cache's {cache.shape[0]} blocks")
    return cache[blocks, token % block_size]


def paged_attention(q: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                    block_tables: np.ndarray, seq_lens: np.ndarray, scale: float) -> np.ndarray:
    """Decode attention reading keys and values through block tables → ``[B, Hq, D]``."""
    q = np.asarray(q, dtype=np.float64)
    key_cache = np.asarray(key_cache, dtype=np.float64)
    value_cache = np.asarray(value_cache, dtype=np.float64)
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    batch, num_q_heads, _ = q.shape
    num_kv_heads = key_cache.shape[2]
    out = np.empty_like(q)
    for b in range(batch):
        length = int(seq_lens[b])
        if length < 1:
            raise ValueError(f"seq_lens[{b}] = {length} < 1")
        keys = gather_paged(key_cache, block_tables[b], length)
        values = gather_paged(value_cache, block_tables[b], length)
        for h in range(num_q_heads):
            g = kv_head_for(h, num_q_heads, num_kv_heads)
            out[b, h] = attend(q[b, h][None, :], keys[:, g], values[:, g], scale)[0]
    return out


def reshape_and_cache(key: np.ndarray, value: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                      slot_mapping: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Copies of the caches with token ``t`` written at slot ``slot_mapping[t]`` (−1: skipped).

    Every other slot keeps its previous content, bit for bit.
    """
    key_out = np.array(key_cache, copy=True)
    value_out = np.array(value_cache, copy=True)
    num_blocks, block_size = key_out.shape[:2]
    for t, slot in enumerate(np.asarray(slot_mapping, dtype=np.int64)):
        if slot == -1:
            continue
        if not 0 <= slot < num_blocks * block_size:
            raise ValueError(f"slot_mapping[{t}] = {slot} outside the cache's {num_blocks * block_size} slots")
        block, offset = divmod(int(slot), block_size)
        key_out[block, offset] = key[t]
        value_out[block, offset] = value[t]
    return key_out, value_out


def kv_cache_format(kv_cache_dtype: str, e4m3_flavour: str = "e4m3fn") -> Fp8Format:
    """The fp8 format of a vLLM ``kv_cache_dtype`` ('fp8_e4m3' in the backend's e4m3 flavour)."""
    if kv_cache_dtype == "fp8_e5m2":
        return E5M2
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return fp8_format(e4m3_flavour)
    raise ValueError(f"not an fp8 kv_cache_dtype: {kv_cache_dtype!r} (fp8_e4m3 or fp8_e5m2)")


def quantize_kv(x: np.ndarray, scale: float, fmt: Fp8Format) -> np.ndarray:
    """The code an fp8 cache stores for ``x``: x / scale clamped to ±max, nearest-even on the grid."""
    v = np.clip(np.asarray(x, dtype=np.float64) / float(scale), -fmt.max_finite, fmt.max_finite)
    return round_to_fp8(v, fmt)


def paged_attention_fp8(q: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray, block_tables: np.ndarray,
                        seq_lens: np.ndarray, scale: float, kv_cache_dtype: str, k_scale: float,
                        v_scale: float) -> np.ndarray:
    """Paged decode attention over fp8 caches: the codes given (as float64 values) times their scale."""
    keys = np.asarray(key_cache, dtype=np.float64) * float(k_scale)
    values = np.asarray(value_cache, dtype=np.float64) * float(v_scale)
    return paged_attention(q, keys, values, block_tables, seq_lens, scale)


def reshape_and_cache_fp8(key: np.ndarray, value: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                          slot_mapping: np.ndarray, kv_cache_dtype: str, k_scale: float, v_scale: float,
                          e4m3_flavour: str = "e4m3fn") -> tuple[np.ndarray, np.ndarray]:
    """The fp8 caches (codes as float64 values) after writing ``quantize_kv(key / value)`` by slot."""
    fmt = kv_cache_format(kv_cache_dtype, e4m3_flavour)
    return reshape_and_cache(quantize_kv(key, k_scale, fmt), quantize_kv(value, v_scale, fmt), key_cache,
                             value_cache, slot_mapping)
