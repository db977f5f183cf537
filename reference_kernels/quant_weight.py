"""Weight-quantized GEMM references: int4 weight-only (GPTQ and AWQ checkpoint layouts) and
DeepSeek-V3-style block fp8 (W8A8 with 1×block_k activation groups, or W8A16).

Every code is unpacked here from the checkpoint's own int32 words, independently of the
packers in adaptcheck (which build the inputs): a packer and this unpacker that disagree
make a correct kernel fail, so the pair is tested against each other with known words
(tests/reference_kernels/test_quant_weight.py). Dequantization and the product are exact
float64: a code times a scale has at most 4 + 24 significant bits.

Layouts (the checkpoints', as vLLM reads them):

* GPTQ: ``qweight`` int32 [K/8, N], eight 4-bit codes of consecutive K rows per word,
  row ``8i + j`` in bits ``4j .. 4j+3``; ``qzeros`` int32 [G, N/8], eight consecutive
  columns per word in the same nibble order; ``scales`` [G, N]; ``g_idx`` [K] maps each K
  row to its group (act-order / desc_act: a permutation's groups; else ``k // group``).
  GPTQ v1 convention (AutoGPTQ, GPTQModel's default ``checkpoint_format: gptq``): the
  stored zero is ``zero - 1``, so the zero applied is ``stored + 1``; a symmetric checkpoint
  stores 7 everywhere and means 8 — vLLM's ``uint4b8`` (uint4 with bias 8).
* AWQ: ``qweight`` int32 [K, N/8] packed along N, ``qzeros`` int32 [G, N/8], both in AWQ's
  interleaved nibble order: nibble ``i`` of a word holds column ``AWQ_ORDER[i]`` of its
  eight; zeros are stored as they are applied (no offset); no ``qzeros``: symmetric, zero 8.
"""

from __future__ import annotations

import numpy as np

from reference_kernels.gemm import gemm

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""Nibble i of an AWQ word holds column AWQ_ORDER[i] of its group of eight."""


def nibbles(words: np.ndarray) -> np.ndarray:
    """[..., W] int32 words → [..., W, 8]: nibble j (bits 4j..4j+3) of each word, as int64."""
    w = np.asarray(words, dtype=np.int64) & 0xFFFFFFFF  # the word's 32 bits, sign dropped
    shifts = np.arange(8, dtype=np.int64) * 4
    return (w[..., None] >> shifts) & 0xF


def unpack_rows(qweight: np.ndarray) -> np.ndarray:
    """GPTQ qweight [K/8, N] → codes [K, N] (word i holds rows 8i..8i+7)."""
    nib = nibbles(qweight)  # [K/8, N, 8]
    return nib.transpose(0, 2, 1).reshape(-1, nib.shape[1])


def unpack_cols(packed: np.ndarray, awq: bool) -> np.ndarray:
    """Packed along the last axis [R, N/8] → [R, N]; AWQ's interleaved order undone when ``awq``."""
    nib = nibbles(packed)  # [R, N/8, 8]: nib[..., i] is nibble i
    if awq:
        cols = np.empty_like(nib)
        cols[..., list(AWQ_ORDER)] = nib  # column AWQ_ORDER[i] ← nibble i
        nib = cols
    return nib.reshape(nib.shape[0], -1)


def group_index(k: int, group_size: int, g_idx: np.ndarray | None) -> np.ndarray:
    """Group of each of K rows: g_idx when given, else k // group_size (-1: one group)."""
    if g_idx is not None:
        return np.asarray(g_idx, dtype=np.int64).reshape(-1)
    size = k if group_size == -1 else group_size
    return np.arange(k) // size


def dequantize_int4(qweight: np.ndarray, qzeros: np.ndarray | None, scales: np.ndarray,
                    g_idx: np.ndarray | None, group_size: int, fmt: str) -> np.ndarray:
    """The [K, N] float64 weight of a GPTQ or AWQ layer: (code - zero[g(k), n]) · scale[g(k), n]."""
    if fmt == "gptq":
        codes = unpack_rows(qweight)
    elif fmt == "awq":
        codes = unpack_cols(qweight, awq=True)
    else:
        raise ValueError(f"unknown int4 format {fmt!r} (gptq, awq)")
    k, n = codes.shape
    s = np.asarray(scales, dtype=np.float64)
    if qzeros is None:
        zeros = np.full(s.shape, 8, dtype=np.int64)
    else:
        zeros = unpack_cols(qzeros, awq=fmt == "awq")
        if fmt == "gptq":
            zeros = zeros + 1  # v1 stores zero - 1 (inputs keep zero in 1..15: no stored 15 to wrap)
    g = group_index(k, group_size, g_idx)
    return (codes - zeros[g, :n]).astype(np.float64) * s[g, :n]


def int4_w4a16_gemm(x: np.ndarray, qweight: np.ndarray, qzeros: np.ndarray | None, scales: np.ndarray,
                    g_idx: np.ndarray | None, group_size: int, fmt: str) -> np.ndarray:
    """out[M, N] = x[M, K] @ dequantize_int4(...) in float64."""
    return gemm(np.asarray(x, dtype=np.float64), dequantize_int4(qweight, qzeros, scales, g_idx, group_size, fmt))


def expand_blocks(scale: np.ndarray, rows: int, cols: int, block_r: int, block_c: int) -> np.ndarray:
    """Block scales [ceil(R/br), ceil(C/bc)] → one per element [R, C] (scale[r // br, c // bc])."""
    s = np.asarray(scale, dtype=np.float64)
    return s[np.arange(rows)[:, None] // block_r, np.arange(cols)[None, :] // block_c]


def block_fp8_gemm(a: np.ndarray, a_scale: np.ndarray | None, b: np.ndarray, b_scale: np.ndarray,
                   block_n: int, block_k: int, out_dtype: object = None) -> np.ndarray:
    """out[M, N] = (a · a_scale[m, k // block_k]) @ (b · b_scale[n // block_n, k // block_k])ᵀ.

    ``a`` holds fp8 values with per-token-group scales (W8A8), or the activations themselves
    when ``a_scale`` is None (W8A16); ``b`` [N, K] holds fp8 values (as float64 here).
    """
    b64 = np.asarray(b, dtype=np.float64)
    n, k = b64.shape
    w = b64 * expand_blocks(b_scale, n, k, block_n, block_k)
    a64 = np.asarray(a, dtype=np.float64)
    if a_scale is not None:
        a64 = a64 * expand_blocks(a_scale, a64.shape[0], k, 1, block_k)
    return gemm(a64, w.T)
