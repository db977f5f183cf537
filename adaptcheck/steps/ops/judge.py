"""Compare one op output with its float64 reference and say by how much it is off (the figures
and the modes: docs/ops.md, "What is measured"). Reproducers copy this code, so it uses
torch, NumPy and plain dataclasses only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from adaptcheck.steps.ops.tolerance import ToleranceClass

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class Worst:
    """The element furthest off (a non-finite surprise first); non-finite values as strings."""

    index: list[int]
    got: float | str
    expected: float | str
    abs_error: float | str


@dataclass
class OutputComparison:
    """Evidence for one output of one case in one dtype."""

    output: str
    mode: str
    passed: bool
    ratio: float
    """Measured error / limit (inf for an exact mismatch or a non-finite surprise)."""
    limits: dict[str, float | None]
    """The limits applied, by name (those of the class's mode; ``max_code_distance`` in codes mode)."""
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatch_fraction: float = 0.0
    cosine: float | None = None
    normalized: float | None = None
    max_ulp: int | None = None
    nonfinite_got: int = 0
    nonfinite_ref: int = 0
    elements: int = 0
    worst: Worst | None = None
    """None when nothing was compared (a shape mismatch)."""
    reason: str = ""


def _ordered_bits(t: torch.Tensor) -> np.ndarray:
    """Float bits as integers ordered like the values (for ULP distances)."""
    ints = t.contiguous().view(_INT_VIEW[t.element_size()]).to(torch.int64).numpy()
    sign = np.int64(1) << np.int64(8 * t.element_size() - 1)
    if t.element_size() == 1:
        ints = ints & 0xFF
    magnitude = ints & (sign - 1)
    return np.where(ints & sign, -magnitude, magnitude)


def ulp_distance(got: torch.Tensor, ref: np.ndarray) -> np.ndarray:
    """Per-element ULP distance between ``got`` and the reference rounded to got's dtype."""
    ref_t = torch.from_numpy(np.ascontiguousarray(ref)).to(got.dtype)
    return np.abs(_ordered_bits(got.cpu()) - _ordered_bits(ref_t))


def compare(
    name: str,
    got: torch.Tensor,
    ref: np.ndarray,
    dtype: str,
    klass: ToleranceClass,
    mask: np.ndarray | None = None,
) -> OutputComparison:
    """Judge ``got`` (any device, any dtype) against ``ref`` (float64 / int64 NumPy)."""
    # -inf - -inf where masked logits agree is expected, and handled below: no warnings.
    with np.errstate(invalid="ignore", over="ignore"):
        return _compare(name, got, ref, dtype, klass, mask)


def _compare(
    name: str,
    got: torch.Tensor,
    ref: np.ndarray,
    dtype: str,
    klass: ToleranceClass,
    mask: np.ndarray | None = None,
) -> OutputComparison:
    """Judge ``got`` (any device, any dtype) against ``ref`` (float64 / int64 NumPy)."""
    limit = klass.limit_for(dtype)
    limits: dict[str, float | None] = {k: v for k, v in limit.model_dump().items() if v is not None}
    if klass.mode == "codes":
        limits["max_code_distance"] = klass.max_code_distance
    got_cpu = got.detach().cpu()
    if tuple(got_cpu.shape) != tuple(ref.shape):
        return OutputComparison(name, klass.mode, False, math.inf, limits,
                                reason=f"shape {tuple(got_cpu.shape)} != reference {tuple(ref.shape)}")
    g = got_cpu.to(torch.float64).numpy() if got_cpu.is_floating_point() else got_cpu.to(torch.int64).numpy()
    r = np.asarray(ref)
    if mask is not None:
        g_sel, r_sel = g[mask], r[mask]
    else:
        g_sel, r_sel = g.reshape(-1), r.reshape(-1)
    res = OutputComparison(name, klass.mode, True, 0.0, limits, elements=int(r_sel.size))
    if r_sel.size == 0:
        res.reason = "nothing to compare (mask selected no element)"
        res.passed = False
        res.ratio = math.inf
        return res

    g_f = g_sel.astype(np.float64)
    r_f = r_sel.astype(np.float64)
    fin_r = np.isfinite(r_f)
    fin_g = np.isfinite(g_f)
    res.nonfinite_got = int((~fin_g).sum())
    res.nonfinite_ref = int((~fin_r).sum())
    # Where the reference is non-finite (masked logits = -inf), the device must agree exactly.
    special_bad = (~fin_r) & ~((g_f == r_f) | (np.isnan(g_f) & np.isnan(r_f)))
    surprise = fin_r & ~fin_g
    both = fin_r & fin_g
    diff = np.abs(g_f - r_f)
    diff[~both] = 0.0
    res.max_abs = float(diff.max(initial=0.0))
    guard = max(float(np.abs(r_f[fin_r]).max(initial=0.0)) * 1e-6, 1e-12)
    rel = diff / np.maximum(np.abs(np.where(fin_r, r_f, 0.0)), guard)
    res.max_rel = float(rel.max(initial=0.0))

    if klass.mode == "allclose":
        assert limit.atol is not None and limit.rtol is not None  # the policy validator guarantees both
        allowed = limit.atol + limit.rtol * np.abs(np.where(fin_r, r_f, 0.0))
        bad = (diff > allowed) | special_bad | surprise
        score = diff / np.maximum(allowed, 1e-300)
        res.ratio = float(score.max(initial=0.0))
    elif klass.mode == "normalized":
        assert limit.max_normalized is not None and limit.min_cosine is not None  # guaranteed by the validator
        scale = float(np.abs(r_f[both]).max(initial=0.0)) or 1.0
        res.normalized = res.max_abs / scale
        gv, rv = g_f[both], r_f[both]
        denom = float(np.linalg.norm(gv) * np.linalg.norm(rv))
        res.cosine = float(np.dot(gv, rv) / denom) if denom > 0 else (1.0 if not gv.any() and not rv.any() else 0.0)
        bad = (diff > limit.max_normalized * scale) | special_bad | surprise
        cos_short = (1.0 - res.cosine) / max(1.0 - limit.min_cosine, 1e-12)
        res.ratio = max(res.normalized / max(limit.max_normalized, 1e-300), cos_short)
    elif klass.mode == "exact":
        bad = (diff > 0) | special_bad | surprise
        res.ratio = math.inf if bad.any() else 0.0
    else:  # codes
        if got_cpu.is_floating_point():
            dist = ulp_distance(got_cpu, r).astype(np.float64)
            dist = dist[mask] if mask is not None else dist.reshape(-1)
        else:
            dist = diff
        bad = (dist > klass.max_code_distance) | special_bad | surprise  # type: ignore[operator]
        res.ratio = float(dist.max(initial=0.0)) / max(klass.max_code_distance or 0, 1)
        if klass.max_code_distance == 0:
            res.ratio = math.inf if bad.any() else 0.0

    # ULPs only mean something element-wise: a cancelling dot product has huge ULP distances.
    if got_cpu.is_floating_point() and got_cpu.dtype != torch.float64 and klass.mode == "allclose":
        try:
            ulps = ulp_distance(got_cpu, r)
            ulps = ulps[mask] if mask is not None else ulps.reshape(-1)
            finite_ulps = ulps[both]
            res.max_ulp = int(finite_ulps.max(initial=0))
        except (TypeError, RuntimeError, KeyError):
            res.max_ulp = None
    res.mismatch_fraction = float(bad.sum()) / float(bad.size)
    if surprise.any() or special_bad.any():
        res.ratio = math.inf
    res.passed = not bad.any() and res.ratio <= 1.0
    if klass.mode == "normalized" and not res.passed and not bad.any():
        res.reason = f"cosine {res.cosine:.6f} below {limit.min_cosine}"
    worst_pool = np.where(surprise | special_bad, np.inf, diff)
    flat = int(np.argmax(worst_pool)) if worst_pool.size else 0
    full_index = np.argwhere(mask)[flat] if mask is not None else np.unravel_index(flat, r.shape)
    res.worst = Worst(index=[int(i) for i in full_index], got=_num(g_f[flat]), expected=_num(r_f[flat]),
                      abs_error=_num(abs(g_f[flat] - r_f[flat]) if np.isfinite(g_f[flat] - r_f[flat]) else math.inf))
    if not res.passed and not res.reason:
        res.reason = (f"{int(bad.sum())} of {bad.size} elements out of tolerance; worst at {res.worst.index}:"
                      f" got {res.worst.got} expected {res.worst.expected}")
    return res


def _num(x: float) -> float | str:
    x = float(x)
    return x if math.isfinite(x) else str(x)
