"""``smoke.matmul``: device matmul per dtype against a CPU float64 reference (square and
long-K cases), sized to the device, one outcome per dtype.

The cases, the sizing and the precision switches: docs/smoke.md (Matmul).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.base.dtypes import FloatDtype, torch_dtype
from adaptcheck.base.schemas.smoke_evidence import CaseSizing, MatmulCase, MatmulEvidence, MatmulSizing
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.smoke.numerics import (
    MATMUL_TOLERANCES,
    MatmulTolerance,
    compare_to_reference,
)
from adaptcheck.steps.smoke.ops import DeviceOps, SmokeCheck, timed
from adaptcheck.steps.smoke.sizing import (
    RateProbe,
    estimated_seconds,
    largest_fitting,
    probe_rate,
)

if TYPE_CHECKING:
    import torch

    from adaptcheck.backends.base import Backend

MIN_N = 32
"""Smallest square case: below this a GEMM is not exercising a tiled path at all."""
N_MULTIPLE = 32
LONG_K_ROWS = 64
"""Rows and columns of the long-K case (its K is what grows)."""
MIN_K = 256
K_MULTIPLE = 256
PROBE_FRACTION = 1 / 40
"""A sizing probe stops doubling once one run takes this share of the case budget."""


InputKind = Literal["normal", "uniform"]


class MatmulParams(BaseModel):
    """Which dtypes, and how much time and size the matmuls may take."""

    model_config = ConfigDict(extra="forbid")

    dtypes: list[FloatDtype] = Field(
        default=["fp32", "bf16", "fp16"], min_length=1,
        description="Dtypes to multiply in (each gets its own result).")
    budget_s: float = Field(
        default=2.0, gt=0, le=600,
        description="Target seconds per dtype for its measured matmuls: device run plus float64 CPU "
                    "reference, half for the square case and half for the long-K case (sizing probes extra).")
    max_n: int = Field(default=4096, ge=MIN_N, le=32768, description="Upper bound of the square case's n.")
    max_k: int = Field(default=65536, ge=MIN_K, le=131072,
                       description="Upper bound of the long-K case's K (≤131072 keeps fp16 sums of "
                                   "[0,1) products below the fp16 maximum).")


@contextmanager
def full_fp32_precision(backend: Backend) -> Iterator[dict[str, str]]:
    """Turn off TF32/HF32 and reduced-precision fp32 matmul where this torch and backend have
    the switches; restore every one on exit. Yields what was changed (for the record).

    Device-generic: looks for a ``matmul`` namespace on ``torch.backends.<device_type>`` and on
    the backend's torch module (``torch.npu.matmul.allow_hf32`` …) instead of naming vendors.
    """
    import torch

    changed: dict[str, str] = {}
    restore: list[tuple[Any, str, Any]] = []
    prev_precision = torch.get_float32_matmul_precision()
    if prev_precision != "highest":
        torch.set_float32_matmul_precision("highest")
        changed["torch.float32_matmul_precision"] = f"{prev_precision} -> highest"
    holders: list[tuple[str, Any]] = [(f"torch.backends.{backend.device_type}", getattr(torch.backends, backend.device_type, None))]
    try:
        holders.append((f"torch.{backend.torch_module}", backend.torch_api()))
    except Exception as exc:  # noqa: BLE001 - no device module means no switches to turn
        changed[f"torch.{backend.torch_module}"] = f"not importable: {type(exc).__name__}: {exc}"
    for label, holder in holders:
        mm = getattr(holder, "matmul", None) if holder is not None else None
        if mm is None:
            continue
        # New-style torch exposes fp32_precision and complains when it is mixed with the
        # legacy allow_tf32; use the legacy switch only where the new one is absent.
        wanted: list[tuple[str, Any]] = [("allow_hf32", False)]
        wanted.append(("fp32_precision", "ieee") if _has(mm, "fp32_precision") else ("allow_tf32", False))
        for attr, value in wanted:
            if not _has(mm, attr):
                continue
            try:
                current = getattr(mm, attr)
                if current != value:
                    setattr(mm, attr, value)
                    restore.append((mm, attr, current))
                    changed[f"{label}.matmul.{attr}"] = f"{current} -> {value}"
            except Exception as exc:  # noqa: BLE001 - a switch we cannot turn is recorded, not fatal
                changed[f"{label}.matmul.{attr}"] = f"could not set: {type(exc).__name__}: {exc}"
    try:
        yield changed
    finally:
        for mm, attr, value in reversed(restore):
            setattr(mm, attr, value)
        torch.set_float32_matmul_precision(prev_precision)


def _has(obj: Any, attr: str) -> bool:
    try:
        return hasattr(obj, attr)
    except Exception:  # noqa: BLE001 - some torch namespaces raise on lookup in CPU-only builds
        return False


def _limited_by(at_cap: bool, cap: str, device: RateProbe, reference: RateProbe) -> str:
    """What bounded a chosen size: the cap, or the budget through the slower of device and
    CPU reference (on fast accelerators it is usually the float64 reference)."""
    if at_cap:
        return cap
    return "budget (device)" if device.rate <= reference.rate else "budget (float64 reference)"


def _inputs(ctx: CheckContext, dtype: torch.dtype, shape_a: tuple[int, int], shape_b: tuple[int, int],
            kind: InputKind, salt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Host inputs generated in fp32, then rounded to ``dtype`` (the reference uses the rounded values)."""
    import torch

    g = ctx.generator(salt)
    make = torch.randn if kind == "normal" else torch.rand
    a = make(shape_a, generator=g, dtype=torch.float32).to(dtype)
    b = make(shape_b, generator=g, dtype=torch.float32).to(dtype)
    return a, b


class MatmulCheck(SmokeCheck):
    """Device matmul per dtype vs a CPU float64 reference, with device-sized shapes."""

    kind = "smoke.matmul"
    description = "Device matmul per dtype agrees with a CPU float64 reference (square and long-K), sized to the device."
    params_model = MatmulParams

    def __init__(self, ops: DeviceOps | None = None) -> None:
        super().__init__(ops)
        self._ref_rates: dict[str, RateProbe] = {}

    def run(self, ctx: CheckContext, params: MatmulParams) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for name in dict.fromkeys(params.dtypes):  # de-duplicated, order kept
            if name not in ctx.backend.dtypes:
                outcomes.append(Outcome.skipped(
                    f"{ctx.backend.name} backend does not declare {name}", applicable=False, subid=name,
                    details=MatmulEvidence(declared_dtypes=list(ctx.backend.dtypes)).dump()))
                continue
            try:
                with full_fp32_precision(ctx.backend) as switches:
                    outcomes.append(self._run_dtype(ctx, params, name, switches))
            except Exception as exc:  # noqa: BLE001 - one dtype's crash must not hide the others' verdicts
                outcomes.append(Outcome.errored(f"{name} matmul raised {type(exc).__name__}: {exc}", subid=name,
                                                details=MatmulEvidence(traceback=traceback.format_exc()[-4000:]).dump()))
        return outcomes

    # --- timing helpers -------------------------------------------------------------
    def _time_device(self, ctx: CheckContext, dtype: torch.dtype, m: int, k: int, n: int, warm: bool = False) -> float:
        """Seconds of one device matmul of m×k·k×n; with ``warm`` an untimed run goes first
        (the first call on a device pays library and kernel set-up, not the matmul)."""
        import torch

        # Ones, made on the device: timing needs no particular values (and no copy), but
        # uninitialised memory could hold denormals, which are slow on some CPUs.
        a = torch.ones((m, k), dtype=dtype, device=ctx.device)
        b = torch.ones((k, n), dtype=dtype, device=ctx.device)
        if warm:
            timed(ctx.backend, ctx.device_index, lambda: self.ops.matmul(a, b))
        return timed(ctx.backend, ctx.device_index, lambda: self.ops.matmul(a, b))[1]

    @staticmethod
    def _time_reference(m: int, k: int, n: int, warm: bool = False) -> float:
        import time

        import torch

        a = torch.ones((m, k), dtype=torch.float64)
        b = torch.ones((k, n), dtype=torch.float64)
        if warm:
            torch.matmul(a, b)
        start = time.perf_counter()
        torch.matmul(a, b)
        return time.perf_counter() - start

    def _reference_rate(self, case: str, params: MatmulParams, target_s: float) -> RateProbe:
        """float64 CPU rate for a case shape, measured once per check (shared by dtypes)."""
        if case not in self._ref_rates:
            r = LONG_K_ROWS
            if case == "square":
                self._time_reference(MIN_N, MIN_N, MIN_N, warm=True)
                self._ref_rates[case] = probe_rate(lambda s: self._time_reference(s, s, s), lambda s: 2.0 * s**3,
                                                   MIN_N, params.max_n, target_s)
            else:
                self._ref_rates[case] = probe_rate(lambda s: self._time_reference(r, s, r),
                                                   lambda s: 2.0 * r * r * s, MIN_K, params.max_k, target_s, growth=4)
        return self._ref_rates[case]

    # --- one dtype ------------------------------------------------------------------
    def _run_dtype(self, ctx: CheckContext, params: MatmulParams, name: str, switches: dict[str, str]) -> Outcome:
        dtype = torch_dtype(name)
        tol = MATMUL_TOLERANCES[name]
        case_budget = params.budget_s / 2
        target = case_budget * PROBE_FRACTION
        r = LONG_K_ROWS

        self._time_device(ctx, dtype, MIN_N, MIN_N, MIN_N, warm=True)  # first call on the device
        dev_sq = probe_rate(lambda s: self._time_device(ctx, dtype, s, s, s), lambda s: 2.0 * s**3,
                            MIN_N, params.max_n, target)
        ref_sq = self._reference_rate("square", params, target)
        n = largest_fitting(lambda s: estimated_seconds(2.0 * s**3, (dev_sq.rate, ref_sq.rate)),
                            case_budget, MIN_N, params.max_n, N_MULTIPLE)
        dev_k = probe_rate(lambda s: self._time_device(ctx, dtype, r, s, r), lambda s: 2.0 * r * r * s,
                           MIN_K, params.max_k, target, growth=4)
        ref_k = self._reference_rate("long_k", params, target)
        k = largest_fitting(lambda s: estimated_seconds(2.0 * r * r * s, (dev_k.rate, ref_k.rate)),
                            case_budget, MIN_K, params.max_k, K_MULTIPLE)

        metrics: dict[str, float] = {"tolerance_normalized": tol.normalized, "tolerance_cosine": tol.cosine}
        evidence = MatmulEvidence(
            dtype=name, tolerance=tol.evidence(), precision_switches=switches or "none changed",
            sizing=MatmulSizing(
                budget_s_per_case=case_budget,
                square=CaseSizing(device_probe=dev_sq.evidence(), reference_probe=ref_sq.evidence(), n=n,
                                  limited_by=_limited_by(n >= params.max_n, "max_n", dev_sq, ref_sq)),
                long_k=CaseSizing(device_probe=dev_k.evidence(), reference_probe=ref_k.evidence(), k=k,
                                  limited_by=_limited_by(k >= params.max_k, "max_k", dev_k, ref_k))))
        problems: list[str] = []
        cases: list[tuple[str, tuple[int, int], tuple[int, int], InputKind]] = [
            ("square", (n, n), (n, n), "normal"),
            ("long_k", (r, k), (k, r), "uniform"),
        ]
        for case, shape_a, shape_b, kind in cases:
            problem, case_metrics, case_details = self._run_case(ctx, dtype, shape_a, shape_b, kind,
                                                                 f"smoke.matmul.{name}.{case}", tol)
            metrics.update({f"{case}.{key}": value for key, value in case_metrics.items()})
            setattr(evidence, case, case_details)
            if problem:
                problems.append(f"{case}: {problem}")
        details = evidence.dump()
        if problems:
            return Outcome.failed(f"{name} matmul wrong: " + "; ".join(problems), subid=name,
                                  metrics=metrics, details=details)
        summary = (f"n={n} normalized error {metrics['square.normalized_error']:.3g}, "
                   f"K={k} {metrics['long_k.normalized_error']:.3g} (limit {tol.normalized:g})")
        return Outcome.passed(f"{name} matmul matches float64: {summary}", subid=name, metrics=metrics, details=details)

    def _run_case(self, ctx: CheckContext, dtype: torch.dtype, shape_a: tuple[int, int], shape_b: tuple[int, int],
                  kind: InputKind, salt: str, tol: MatmulTolerance) -> tuple[str, dict[str, float], MatmulCase]:
        """Run one case; return (problem or '', metrics, details)."""
        import time

        import torch

        a, b = _inputs(ctx, dtype, shape_a, shape_b, kind, salt)
        start = time.perf_counter()
        ref = torch.matmul(a.to(torch.float64), b.to(torch.float64))
        ref_s = time.perf_counter() - start
        a_d = self.ops.to_device(a, ctx.device)
        b_d = self.ops.to_device(b, ctx.device)
        c_d, dev_s = timed(ctx.backend, ctx.device_index, lambda: self.ops.matmul(a_d, b_d))
        flops = 2.0 * shape_a[0] * shape_a[1] * shape_b[1]
        metrics: dict[str, float] = {"m": shape_a[0], "k": shape_a[1], "n": shape_b[1], "device_s": dev_s,
                                     "device_gflops": flops / max(dev_s, 1e-9) / 1e9, "reference_s": ref_s}
        details = MatmulCase(shape=[list(shape_a), list(shape_b)], inputs=kind)
        if c_d.device.type != ctx.backend.device_type:
            return f"result lives on {c_d.device}, not on the {ctx.backend.device_type} device", metrics, details
        if c_d.dtype != dtype or tuple(c_d.shape) != (shape_a[0], shape_b[1]):
            return (f"result is {c_d.dtype} {tuple(c_d.shape)}, expected {dtype} {(shape_a[0], shape_b[1])}",
                    metrics, details)
        cmp = compare_to_reference(self.ops.to_host(c_d), ref)
        metrics.update(normalized_error=cmp.normalized_error, cosine=cmp.cosine, max_abs_error=cmp.max_abs_error,
                       nonfinite=cmp.nonfinite)
        details.comparison = cmp.evidence()
        if cmp.within(tol):
            return "", metrics, details
        if cmp.nonfinite:
            return f"{cmp.nonfinite} non-finite elements", metrics, details
        problem = (f"normalized error {cmp.normalized_error:.3g} (limit {tol.normalized:g}), cosine {cmp.cosine:.6f} "
                   f"(min {tol.cosine:g}); worst at {list(cmp.worst_index)}: {cmp.worst_got:.6g} vs {cmp.worst_ref:.6g}")
        return problem, metrics, details
