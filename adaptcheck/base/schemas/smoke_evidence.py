"""Typed evidence of the step-2 tensor smoke checks (``smoke.*``): one model per kind.

The checks build their ``details`` through these models and readers get them back typed
(``result.evidence(MatmulEvidence)``); what each check proves is in docs/ladders.md (step 2).
Numbers that may be NaN or infinite (a broken matmul's error) are typed floats, so they are
stored as measured rather than turned into nulls.
"""

from __future__ import annotations

from pydantic import Field

from adaptcheck.base.schemas.evidence import Evidence


# ---------------------------------------------------------------- smoke.device_visible ---
class ProbeFacts(Evidence):
    """What the backend's availability probe said."""

    available: bool = Field(description="The backend's device API is usable in this process.")
    reason: str = Field(default="", description="Why it is not available ('' when it is).")
    device_count: int = Field(description="Devices the backend sees.")


class DeviceVisibleEvidence(Evidence):
    """``smoke.device_visible``: the probe, the device and a 16-element add-and-sum on it."""

    probe: ProbeFacts = Field(description="The backend's availability probe.")
    device_type: str = Field(description="The backend's torch device type, e.g. 'cuda', 'npu', 'cpu'.")
    torch_device: str = Field(description="The selected torch device, e.g. 'cuda:0'.")
    device_name: str | None = Field(default=None, description="The device's name; absent when the probe failed.")
    sum_of_2x_arange16: float | None = Field(default=None, description="Sum of arange(16) made on the device plus "
                                             "one copied to it: 240 when the device computes right.")


# ---------------------------------------------------------------- smoke.synchronize ------
class SynchronizeEvidence(Evidence):
    """``smoke.synchronize``: queued work is final once synchronize returns."""

    pinned_host_buffer: bool | str = Field(description="True when the host buffer was page-locked (the copy is "
                                           "asynchronous), False on the host device, else why pinning failed.")
    host_mismatches: int = Field(description="Elements of the host copy that were not final after synchronize.")
    device_mismatches: int = Field(description="Elements on the device that were wrong.")
    note: str | None = Field(default=None, description="Why the check says little on this device (host device).")


# ---------------------------------------------------------------- smoke.dtypes -----------
class DtypeInfo(Evidence):
    """Facts about one dtype that are information, not verdicts."""

    max: float | None = Field(default=None, description="fp8: the largest finite value (448 for e4m3fn).")
    unclamped_cast: dict[str, str] | str | None = Field(
        default=None, description="fp8: what a plain (unclamped) cast made of each out-of-range value, or how it "
                                  "failed.")
    matmul_path: str | None = Field(default=None, description="int8: the matmul path that worked "
                                    "('torch._int_mm' or 'int32 matmul').")
    matmul_attempts: dict[str, str] | None = Field(default=None, description="int8: why each matmul path failed "
                                                   "(only when none worked).")


class DtypeRow(Evidence):
    """One dtype of ``smoke.dtypes``."""

    declared: bool = Field(description="The backend declares the dtype (then it must work).")
    works: bool = Field(description="Every test below gave 'ok'.")
    tests: dict[str, str] = Field(description="Test name → 'ok', the problem, or the error it raised.")
    info: DtypeInfo | None = Field(default=None, description="Information gathered on the way (absent when none).")


class DtypesEvidence(Evidence):
    """``smoke.dtypes``: which dtypes work on the device."""

    dtypes: dict[str, DtypeRow] = Field(description="Per dtype, in ALL_DTYPES order.")
    declared: list[str] = Field(description="Dtypes the backend declares.")
    fp8_flavour: str | None = Field(default=None, description="The backend's fp8 flavour (OCP or fnuz).")


# ---------------------------------------------------------------- smoke.alloc_free -------
class AllocCycle(Evidence):
    """One allocate / write / release cycle of ``smoke.alloc_free`` (bytes)."""

    held_allocated: float = Field(description="Allocator's allocated bytes while the buffer was held (0 without stats).")
    after_allocated: float = Field(description="Allocated bytes after release.")
    held_rss: int = Field(description="Process RSS while held (0 when unreadable).")
    after_rss: int = Field(description="Process RSS after release.")
    wrong_elements: int = Field(description="Words that did not hold the value written.")


class AllocFreeEvidence(Evidence):
    """``smoke.alloc_free``: memory grows while held and returns to its baseline."""

    requested_mib: float = Field(description="Size asked for by the params.")
    reduced_to_mib: float | None = Field(default=None, description="Size used when the request did not fit.")
    reason: str | None = Field(default=None, description="Why the size was reduced.")
    evidence: str | None = Field(default=None, description="What the verdict rests on: allocator statistics, "
                                 "process RSS, or allocation success only.")
    cycles: list[AllocCycle] | None = Field(default=None, description="Every cycle, in order.")


# ---------------------------------------------------------------- smoke.roundtrip --------
class BitDiffEvidence(Evidence):
    """Bit-level difference between what was sent and what came back."""

    elements: int = Field(description="Elements compared.")
    mismatched: int = Field(description="Elements whose bits differ.")
    first_index: int | None = Field(default=None, description="First differing element (absent when none).")
    expected_bits: str | None = Field(default=None, description="Its bits as sent, hex.")
    got_bits: str | None = Field(default=None, description="Its bits as received, hex.")
    problem: str | None = Field(default=None, description="Why the two could not even be compared, or where the "
                                "copy landed instead of the device.")


class RoundTripRow(Evidence):
    """One dtype of ``smoke.roundtrip``."""

    declared: bool = Field(description="The backend declares the dtype (only declared ones are judged).")
    whole: BitDiffEvidence | None = Field(default=None, description="The whole tensor's round trip.")
    offset_view: BitDiffEvidence | None = Field(default=None, description="An element-offset view's round trip.")
    ok: bool | None = Field(default=None, description="Both round trips bit-exact and the source unmodified.")
    error: str | None = Field(default=None, description="What the copy raised.")


class RoundTripEvidence(Evidence):
    """``smoke.roundtrip``: host → device → host is bit-exact."""

    dtypes: dict[str, RoundTripRow] = Field(description="Per dtype sent, in the order sent.")
    note: str | None = Field(default=None, description="Why the check says little on this device (host memory).")


# ---------------------------------------------------------------- smoke.fill_zero --------
class FillPhase(Evidence):
    """One fill pattern of ``smoke.fill_zero``, verified."""

    device_mismatches: int = Field(description="Wrong elements over the whole tensor, counted on the device.")
    host_sample_mismatches: int = Field(description="Wrong elements in the host read-back of sample rows.")
    host_sample_elements: int = Field(description="Elements read back to the host.")


class PositiveControl(Evidence):
    """Planted mismatches the device count must see."""

    planted: int = Field(description="Mismatches planted (3).")
    counted: int = Field(description="Mismatches the device reduction counted.")


class FillZeroEvidence(Evidence):
    """``smoke.fill_zero``: a large tensor holds written patterns and zeros."""

    sized_by: str = Field(description="What bounded the size: max_mib or fraction_of_free.")
    free_bytes: int | None = Field(description="Free device memory when sized; None when unknown.")
    phases: dict[str, FillPhase | PositiveControl] = Field(
        description="Per pattern (pattern_<hex>, row_index, zero) its verification, and the positive_control.")

    @property
    def fill_phases(self) -> dict[str, FillPhase]:
        """The verified fills, without the positive control."""
        return {k: p for k, p in self.phases.items() if isinstance(p, FillPhase)}


# ---------------------------------------------------------------- smoke.matmul -----------
class MatmulToleranceFacts(Evidence):
    """The limits a matmul was judged by."""

    normalized: float = Field(description="Max allowed max|Δ| / max|ref|.")
    cosine: float = Field(description="Min cosine similarity to the reference.")
    note: str = Field(default="", description="What the limit assumes (accumulation, output dtype).")


class RateProbeFacts(Evidence):
    """One timing probe that sized a case."""

    size: int = Field(description="The probed size (n or K).")
    seconds: float = Field(description="Seconds it took.")
    rate: float = Field(description="Work per second (flop/s).")


class CaseSizing(Evidence):
    """How one matmul case was sized."""

    device_probe: RateProbeFacts = Field(description="The device's timing probe.")
    reference_probe: RateProbeFacts = Field(description="The float64 CPU reference's timing probe.")
    n: int | None = Field(default=None, description="square: the chosen n.")
    k: int | None = Field(default=None, description="long_k: the chosen K.")
    limited_by: str = Field(description="What bounded the size: the cap or the budget (device or reference).")


class MatmulSizing(Evidence):
    """The sizing of both cases."""

    budget_s_per_case: float = Field(description="Seconds allowed per case.")
    square: CaseSizing = Field(description="The n×n·n×n case.")
    long_k: CaseSizing = Field(description="The long-K case.")


class ComparisonFacts(Evidence):
    """A result against its float64 reference (NaN/inf kept as measured)."""

    normalized_error: float = Field(description="max|Δ| / max|ref|.")
    max_abs_error: float = Field(description="max|Δ| (NaN when an element is not finite).")
    max_abs_ref: float = Field(description="max|ref|.")
    cosine: float = Field(description="Cosine similarity to the reference.")
    nonfinite: int = Field(description="Non-finite elements of the result.")
    worst_index: list[int] = Field(description="Index of the worst element.")
    worst_got: float = Field(description="Its value on the device.")
    worst_ref: float = Field(description="Its reference value.")


class MatmulCase(Evidence):
    """One matmul case (square or long_k)."""

    shape: list[list[int]] = Field(description="Shapes of A and B.")
    inputs: str = Field(description="Input distribution: normal or uniform.")
    comparison: ComparisonFacts | None = Field(default=None, description="Against the reference; absent when the "
                                               "result was on the wrong device or of the wrong dtype/shape.")


class MatmulEvidence(Evidence):
    """``smoke.matmul.<dtype>``: one dtype's device matmul against a float64 reference."""

    dtype: str | None = Field(default=None, description="The dtype (also the subid).")
    tolerance: MatmulToleranceFacts | None = Field(default=None, description="The limits applied.")
    precision_switches: dict[str, str] | str | None = Field(
        default=None, description="Reduced-precision switches turned off for the run (TF32/HF32), or 'none changed'.")
    sizing: MatmulSizing | None = Field(default=None, description="How the shapes were chosen.")
    square: MatmulCase | None = Field(default=None, description="The square case.")
    long_k: MatmulCase | None = Field(default=None, description="The long-K case.")
    declared_dtypes: list[str] | None = Field(default=None, description="Skip: the dtypes the backend declares.")
    traceback: str | None = Field(default=None, description="Error: the end of the traceback.")


SMOKE_EVIDENCE: dict[str, type[Evidence]] = {
    "smoke.device_visible": DeviceVisibleEvidence,
    "smoke.synchronize": SynchronizeEvidence,
    "smoke.dtypes": DtypesEvidence,
    "smoke.alloc_free": AllocFreeEvidence,
    "smoke.roundtrip": RoundTripEvidence,
    "smoke.fill_zero": FillZeroEvidence,
    "smoke.matmul": MatmulEvidence,
}
"""The evidence model of each step-2 kind (``smoke.streams_events`` records no details)."""
