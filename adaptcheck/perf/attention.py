"""Attention throughput rows: causal GQA prefill and single-token decode over a KV cache, through
``torch.nn.functional.scaled_dot_product_attention`` on the device, sized so one call stays
within ``max_call_s``. FLOP and byte counts, GQA and sizing: docs/perf.md ("Work, traffic and
sizing").
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from adaptcheck.base.dtypes import ITEMSIZE, is_fnuz, torch_dtype
from adaptcheck.base.schemas.micro_evidence import MicroRow, RowExtra
from adaptcheck.perf.micro import (
    Params,
    TimingOptions,
    make_row,
    not_run_row,
)
from adaptcheck.perf.peaks import Peak, fmt_rate

if TYPE_CHECKING:
    from adaptcheck.backends.base import Backend


def prefill_flops(b: int, hq: int, s: int, d: int) -> float:
    return 2.0 * b * hq * s * s * d


def prefill_bytes(b: int, hq: int, hkv: int, s: int, d: int, es: int) -> float:
    return float((2 * b * hq * s * d + 2 * b * hkv * s * d) * es)


def decode_flops(b: int, hq: int, kv_len: int, d: int) -> float:
    return 4.0 * b * hq * kv_len * d


def decode_bytes(b: int, hq: int, hkv: int, kv_len: int, d: int, es: int) -> float:
    return float((2 * b * hq * d + 2 * b * hkv * kv_len * d) * es)


def _has_enable_gqa() -> bool:
    import torch.nn.functional as F

    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a readable signature: try it
        return True


def sdpa_callable(dtype: str, b: int, hq: int, hkv: int, q_len: int, kv_len: int, d: int, causal: bool,
                  backend: Backend, index: int) -> Callable[[], object]:
    """One SDPA call: queries (b, hq, q_len, d) over keys/values (b, hkv, kv_len, d)."""
    import torch
    import torch.nn.functional as F

    device = backend.torch_device(index)
    td = torch_dtype(dtype, fnuz=is_fnuz(backend.fp8_flavour))  # as step 2 resolved it
    gen = torch.Generator(device="cpu").manual_seed(b * 7 + q_len * 13 + kv_len)
    q = torch.randn((b, hq, q_len, d), generator=gen).to(device=device, dtype=td)
    k = torch.randn((b, hkv, kv_len, d), generator=gen).to(device=device, dtype=td)
    v = torch.randn((b, hkv, kv_len, d), generator=gen).to(device=device, dtype=td)
    if hq != hkv and not _has_enable_gqa():
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if hq != hkv:
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _probe(fn: Callable[[], object], backend: Backend, index: int) -> float:
    """Seconds of one call after a warm one."""
    fn()
    backend.synchronize(index)
    t0 = time.perf_counter()
    fn()
    backend.synchronize(index)
    return max(time.perf_counter() - t0, 1e-9)


def bench_prefill(dtype: str, b: int, s: int, hq: int, hkv: int, d: int, backend: Backend, index: int,
                  peak: Peak | None, opts: TimingOptions, *, min_len: int = 64) -> MicroRow:
    """Causal GQA prefill over ``s`` tokens (shrunk if a call would be too long)."""
    requested: Params = {"batch": b, "seq_len": s, "q_heads": hq, "kv_heads": hkv, "head_dim": d}
    name = f"prefill b={b} s={s} hq={hq} hkv={hkv} d={d}"
    if hq % hkv:
        return not_run_row(name, dtype, requested, f"q_heads {hq} is not a multiple of kv_heads {hkv}")
    probe_len = min(s, 256)
    took = _probe(sdpa_callable(dtype, b, hq, hkv, probe_len, probe_len, d, True, backend, index), backend, index)
    rate = prefill_flops(b, hq, probe_len, d) / took
    fitted = s
    while fitted > min_len and prefill_flops(b, hq, fitted, d) / rate > opts.call_limit:
        fitted //= 2
    extra = RowExtra(probe_flops_per_s=rate)
    if prefill_flops(b, hq, fitted, d) / rate > opts.call_limit:
        return not_run_row(name, dtype, requested,
                           f"too slow at this size on this device: measured {fmt_rate(rate)} on a probe "
                           f"(s={probe_len}); s={fitted} would exceed {opts.call_limit:.3g} s per call")
    if fitted != s:
        extra.requested = requested
        extra.shrunk = f"s={s} would take ~{prefill_flops(b, hq, s, d) / rate:.3g} s per call at the probed {fmt_rate(rate)}"
        name = f"prefill b={b} s={fitted} hq={hq} hkv={hkv} d={d}"
    fn = sdpa_callable(dtype, b, hq, hkv, fitted, fitted, d, True, backend, index)
    timing = opts.time(fn, backend, index)
    return make_row(name, dtype, {**requested, "seq_len": fitted, "causal": True}, prefill_flops(b, hq, fitted, d),
                    prefill_bytes(b, hq, hkv, fitted, d, ITEMSIZE[dtype]), timing, peak, extra=extra)


def bench_decode(dtype: str, b: int, kv_len: int, hq: int, hkv: int, d: int, backend: Backend, index: int,
                 peak: Peak | None, opts: TimingOptions, *, min_len: int = 128) -> MicroRow:
    """One query token per sequence over a KV cache of ``kv_len`` tokens (shrunk if too long)."""
    requested: Params = {"batch": b, "kv_len": kv_len, "q_heads": hq, "kv_heads": hkv, "head_dim": d}
    name = f"decode b={b} kv={kv_len} hq={hq} hkv={hkv} d={d}"
    if hq % hkv:
        return not_run_row(name, dtype, requested, f"q_heads {hq} is not a multiple of kv_heads {hkv}")
    probe_len = min(kv_len, 1024)
    took = _probe(sdpa_callable(dtype, b, hq, hkv, 1, probe_len, d, False, backend, index), backend, index)
    per_token = took / probe_len
    fitted = kv_len
    while fitted > min_len and fitted * per_token > opts.call_limit:
        fitted //= 2
    extra = RowExtra(probe_s_per_kv_token=per_token)
    if fitted * per_token > opts.call_limit:
        return not_run_row(name, dtype, requested,
                           f"too slow at this size on this device: a probe over {probe_len} cached tokens took "
                           f"{took:.3g} s; kv={fitted} would exceed {opts.call_limit:.3g} s per call")
    if fitted != kv_len:
        extra.requested = requested
        extra.shrunk = f"kv={kv_len} would take ~{kv_len * per_token:.3g} s per call"
        name = f"decode b={b} kv={fitted} hq={hq} hkv={hkv} d={d}"
    fn = sdpa_callable(dtype, b, hq, hkv, 1, fitted, d, False, backend, index)
    timing = opts.time(fn, backend, index)
    return make_row(name, dtype, {**requested, "kv_len": fitted, "q_len": 1}, decode_flops(b, hq, fitted, d),
                    decode_bytes(b, hq, hkv, fitted, d, ITEMSIZE[dtype]), timing, peak, extra=extra)
