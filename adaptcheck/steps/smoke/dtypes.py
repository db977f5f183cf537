"""``smoke.dtypes``: which of ALL_DTYPES actually work on the device (declared ones must).

The tests per dtype and the verdict: docs/smoke.md (Dtypes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from adaptcheck.base.dtypes import ALL_DTYPES, is_fnuz, torch_dtype
from adaptcheck.base.errors import exception_line
from adaptcheck.base.schemas.smoke_evidence import DtypeInfo, DtypeRow, DtypesEvidence
from adaptcheck.ladder.check import CheckContext, NoParams, Outcome
from adaptcheck.steps.smoke.numerics import bit_diff, int_view
from adaptcheck.steps.smoke.ops import SmokeCheck

if TYPE_CHECKING:
    import torch

OK = "ok"


def _attempt(fn: Callable[[], str | None]) -> str:
    """Run one dtype test: 'ok', the failure it reports, or the exception it raised."""
    try:
        problem = fn()
    except Exception as exc:  # noqa: BLE001 - an unsupported dtype op raises; that is the finding
        return f"error: {exception_line(exc, 230)}"
    return problem or OK


def _same_bits_or_both_nan(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ, not counting places where both are NaN (payloads of a
    converted NaN legitimately differ between implementations)."""
    import torch

    differ = int_view(a) != int_view(b)
    both_nan = torch.isnan(a.to(torch.float32)) & torch.isnan(b.to(torch.float32))
    return int((differ & ~both_nan).sum().item())


class DtypeProbeCheck(SmokeCheck):
    """Which dtypes work on the device; declared ones must."""

    kind = "smoke.dtypes"
    description = "Each declared dtype (fp32, fp16, bf16, fp8 e4m3/e5m2, int8) is created, computed and cast correctly."
    params_model = NoParams

    def run(self, ctx: CheckContext, params: NoParams) -> Outcome:
        table: dict[str, DtypeRow] = {}
        for name in ALL_DTYPES:
            declared = name in ctx.backend.dtypes
            info = DtypeInfo()
            try:
                dtype = torch_dtype(name, fnuz=is_fnuz(ctx.backend.fp8_flavour))
            except Exception as exc:  # noqa: BLE001 - this torch has no such dtype
                tests = {"exists": f"error: {type(exc).__name__}: {exc}"}
            else:
                if name.startswith("fp8"):
                    tests = self._fp8(ctx, dtype, info)
                elif name == "int8":
                    tests = self._int8(ctx, dtype, info)
                else:
                    tests = self._float(ctx, dtype)
            works = all(v == OK for v in tests.values())
            row = DtypeRow(declared=declared, works=works, tests=tests)
            if info.model_fields_set:  # an empty info is left out, as before the model
                row.info = info
            table[name] = row
        broken = [n for n, row in table.items() if row.declared and not row.works]
        working = [n for n, row in table.items() if row.works]
        extra = [n for n in working if not table[n].declared]
        metrics = {"declared": len(ctx.backend.dtypes), "working": len(working), "declared_broken": len(broken)}
        details = DtypesEvidence(dtypes=table, declared=list(ctx.backend.dtypes),
                                 fp8_flavour=ctx.backend.fp8_flavour).dump()
        if broken:
            reasons = [f"{n} ({', '.join(f'{t}: {v}' for t, v in table[n].tests.items() if v != OK)})" for n in broken]
            return Outcome.failed("declared dtypes do not work: " + "; ".join(reasons), metrics=metrics, details=details)
        msg = f"declared dtypes work: {', '.join(ctx.backend.dtypes)}"
        if extra:
            msg += f"; also working though not declared: {', '.join(extra)}"
        return Outcome.passed(msg, metrics=metrics, details=details)

    # --- helpers --------------------------------------------------------------------
    def _copy_problem(self, ctx: CheckContext, host: torch.Tensor) -> tuple[torch.Tensor, str | None]:
        """Copy to the device and back; (device tensor, problem or None)."""
        dev = self.ops.to_device(host, ctx.device)
        if dev.device.type != ctx.backend.device_type or dev.dtype != host.dtype:
            return dev, f"landed as {dev.dtype} on {dev.device}"
        diff = bit_diff(host, self.ops.to_host(dev))
        return dev, None if diff.exact else f"copy changed {diff.mismatched} of {diff.elements} elements"

    def _float(self, ctx: CheckContext, dtype: torch.dtype) -> dict[str, str]:
        import torch

        g = ctx.generator(f"smoke.dtypes.{dtype}")
        a32 = torch.randint(-3, 4, (16, 16), generator=g).to(torch.float32)
        b32 = torch.randint(-3, 4, (16, 16), generator=g).to(torch.float32)
        a_h, b_h = a32.to(dtype), b32.to(dtype)
        state: dict[str, torch.Tensor] = {}

        def create() -> str | None:
            state["a"], problem = self._copy_problem(ctx, a_h)
            state["b"] = self.ops.to_device(b_h, ctx.device)
            return problem

        def add() -> str | None:
            got = self.ops.to_host(state["a"] + state["b"])
            return None if bit_diff((a32 + b32).to(dtype), got).exact else "a + b of small integers is not exact"

        def matmul() -> str | None:
            got = self.ops.to_host(self.ops.matmul(state["a"], state["b"])).to(torch.float64)
            want = a32.to(torch.float64) @ b32.to(torch.float64)  # |sums| ≤ 144: exact in every float dtype
            wrong = int((got != want).sum().item())
            return None if wrong == 0 else f"{wrong} of 256 elements of an exact integer matmul are wrong"

        def cast_roundtrip() -> str | None:
            # Wide exponent range plus specials: the device's fp32→dtype rounding must agree
            # with the CPU's bit for bit (round-to-nearest-even, overflow to inf, underflow).
            x = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-40, 40, (4096,), generator=g).float())
            x = torch.cat([x, torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"),
                                            torch.finfo(dtype).tiny, torch.finfo(dtype).max, 1e-45])])
            down = self.ops.to_host(self.ops.to_device(x, ctx.device).to(dtype))
            wrong = _same_bits_or_both_nan(x.to(dtype), down)
            if wrong:
                return f"fp32 → {dtype} on the device differs from the CPU in {wrong} of {x.numel()} values"
            back = self.ops.to_host(state["a"].to(torch.float32).to(dtype))
            return None if bit_diff(a_h, back).exact else f"{dtype} → fp32 → {dtype} is not the identity"

        tests: dict[str, str] = {"create": _attempt(create)}
        for label, fn in (("add", add), ("matmul", matmul), ("cast_roundtrip", cast_roundtrip)):
            tests[label] = _attempt(fn) if tests["create"] == OK else "not run: create failed"
        return tests

    def _fp8(self, ctx: CheckContext, dtype: torch.dtype, info: DtypeInfo) -> dict[str, str]:
        import torch

        every = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(dtype)  # all 256 bit patterns
        fmax = float(torch.finfo(dtype).max)
        info.max = fmax

        def create() -> str | None:
            return self._copy_problem(ctx, every)[1]

        def cast_roundtrip() -> str | None:
            values = every.to(torch.float32)
            values = values[torch.isfinite(values)]  # every finite fp8 value is exact in fp32
            got = self.ops.to_host(self.ops.to_device(values, ctx.device).to(dtype).to(torch.float32))
            wrong = int((got != values).sum().item())
            return None if wrong == 0 else f"{wrong} of {values.numel()} finite values changed through fp32 → fp8 → fp32"

        def saturation() -> str | None:
            # Just above max (rounds to max when clamped, NaN/inf when not on some devices),
            # far above, and the e4m3fn case the field hits (≥ 465 turns NaN unclamped).
            x = torch.tensor([fmax, fmax * 1.03, fmax * 1.5, fmax * 4, 1e30, -fmax * 1.5, -1e30])
            want = torch.tensor([fmax, fmax, fmax, fmax, fmax, -fmax, -fmax])
            x_d = self.ops.to_device(x, ctx.device)
            try:  # how a plain (unclamped) cast behaves is information, not a verdict
                plain = self.ops.to_host(x_d.to(dtype).to(torch.float32))
                info.unclamped_cast = {f"{v:g}": f"{p:g}" for v, p in zip(x.tolist(), plain.tolist(), strict=False)}
            except Exception as exc:  # noqa: BLE001 - how a plain cast fails is information too
                info.unclamped_cast = f"error: {type(exc).__name__}: {exc}"
            got = self.ops.to_host(torch.clamp(x_d, -fmax, fmax).to(dtype).to(torch.float32))
            wrong = int((got != want).sum().item())
            return None if wrong == 0 else f"clamp-then-cast gave {got.tolist()}, expected ±{fmax:g}"

        tests: dict[str, str] = {"create": _attempt(create)}
        for label, fn in (("cast_roundtrip", cast_roundtrip), ("saturation", saturation)):
            tests[label] = _attempt(fn) if tests["create"] == OK else "not run: create failed"
        return tests

    def _int8(self, ctx: CheckContext, dtype: torch.dtype, info: DtypeInfo) -> dict[str, str]:
        import torch

        every = torch.arange(-128, 128, dtype=torch.int64).to(torch.int8)
        g = ctx.generator("smoke.dtypes.int8")
        state: dict[str, torch.Tensor] = {}

        def create() -> str | None:
            state["every"], problem = self._copy_problem(ctx, every)
            return problem

        def add() -> str | None:
            a = torch.randint(-60, 61, (1024,), generator=g, dtype=torch.int8)
            b = torch.randint(-60, 61, (1024,), generator=g, dtype=torch.int8)
            got = self.ops.to_host(self.ops.to_device(a, ctx.device) + self.ops.to_device(b, ctx.device))
            return None if bit_diff(a + b, got).exact else "int8 add of small values is not exact"

        def cast_roundtrip() -> str | None:
            back = self.ops.to_host(state["every"].to(torch.int32).to(torch.int8))
            return None if bit_diff(every, back).exact else "int8 → int32 → int8 is not the identity"

        def matmul() -> str | None:
            # Shapes meet torch._int_mm's constraints on accelerators (m > 16, k and n multiples of 8).
            a = torch.randint(-128, 128, (32, 64), generator=g, dtype=torch.int8)
            b = torch.randint(-128, 128, (64, 32), generator=g, dtype=torch.int8)
            want = a.to(torch.int64) @ b.to(torch.int64)
            a_d, b_d = self.ops.to_device(a, ctx.device), self.ops.to_device(b, ctx.device)
            attempts: dict[str, str] = {}
            for path, fn in (("torch._int_mm", lambda: torch._int_mm(a_d, b_d)),
                             ("int32 matmul", lambda: self.ops.matmul(a_d.to(torch.int32), b_d.to(torch.int32)))):
                if path == "torch._int_mm" and not hasattr(torch, "_int_mm"):
                    attempts[path] = "absent in this torch"
                    continue
                try:
                    got = self.ops.to_host(fn())
                except Exception as exc:  # noqa: BLE001 - try the next path
                    attempts[path] = f"error: {exception_line(exc, 190)}"
                    continue
                info.matmul_path = path
                if got.dtype != torch.int32:
                    return f"{path} returned {got.dtype}, expected int32 accumulation"
                wrong = int((got.to(torch.int64) != want).sum().item())
                return None if wrong == 0 else f"{path}: {wrong} of {want.numel()} elements differ from int64"
            info.matmul_attempts = attempts
            return "no int8 matmul path works: " + "; ".join(f"{k}: {v}" for k, v in attempts.items())

        tests: dict[str, str] = {"create": _attempt(create)}
        for label, fn in (("add", add), ("cast_roundtrip", cast_roundtrip), ("matmul", matmul)):
            tests[label] = _attempt(fn) if tests["create"] == OK else "not run: create failed"
        return tests
