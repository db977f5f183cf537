"""Device peak figures (``matrices/peaks.yaml``: strict schema, first matching entry), the
:class:`Peak` efficiencies are computed against (SI units; recorded as a
:class:`~adaptcheck.base.schemas.micro_evidence.PeakRecord`), and the roofline that turns a
measurement into an efficiency and a bound class. Details: docs/perf.md ("Peaks and the
roofline"); the CPU peak derived from what the machine reports is :mod:`adaptcheck.perf.cpu_peak`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adaptcheck.base.schemas.micro_evidence import PeakRecord
from adaptcheck.base.yamldata import (
    MatrixError,
    load_model,
    matrices_file,
    parse_model,
)

PEAK_DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8")
"""Dtype keys of ``dense_tflops`` (tf32: fp32 GEMMs when torch allows TensorFloat-32)."""

Bound = Literal["compute", "memory", "link", "network"]


class PeaksError(MatrixError):
    """A peaks file is malformed; the message names the file and line."""


class PeakEntry(BaseModel):
    """One device model's published peak figures."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9_]+$", description="Entry id, recorded as the peak's 'entry' in results.")
    match: str = Field(min_length=1, description="Regex searched (case-insensitive) in the device name torch reports.")
    vendor: str = Field(min_length=1, description="Vendor, for people reading the file.")
    backends: list[str] = Field(min_length=1, description="adaptcheck backend names the entry applies to.")
    dense_tflops: dict[str, float] = Field(
        default_factory=dict, description=f"Dense (no sparsity) peak TFLOP/s (TOP/s for int8) by dtype: "
                                          f"{', '.join(PEAK_DTYPES)}.")
    memory_gbps: float | None = Field(default=None, gt=0, description="Device memory bandwidth, GB/s (1e9 bytes/s).")
    host_link_gbps: float | None = Field(
        default=None, gt=0, description="Host link bandwidth per direction, GB/s (PCIe Gen5 x16: 64; Gen4 x16: 32).")
    interconnect_gbps: float | None = Field(
        default=None, gt=0, description="Device-to-device bandwidth per direction per device, GB/s (NVLink, "
                                        "Infinity Fabric, HCCS …); the ceiling for collectives' busbw.")
    source: str = Field(min_length=1, description="Where the figures come from: datasheet name and URL.")
    verified: bool = Field(description="True when every figure was checked against the source; false marks "
                                       "figures taken from secondary pages or estimates.")
    notes: str = Field(default="", description="Caveats (SKU differences, clocks, which figure is which).")

    @field_validator("match")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regex: {exc}") from None
        return value

    @field_validator("dense_tflops")
    @classmethod
    def _dtypes(cls, value: dict[str, float]) -> dict[str, float]:
        for key, tflops in value.items():
            if key not in PEAK_DTYPES:
                raise ValueError(f"unknown dtype {key!r}; valid: {', '.join(PEAK_DTYPES)}")
            if not tflops > 0:
                raise ValueError(f"{key}: TFLOP/s must be > 0")
        return value


class PeaksFile(BaseModel):
    """``matrices/peaks.yaml``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = Field(description="Version of this file's layout.")
    entries: list[PeakEntry] = Field(description="Device models; the first matching entry wins.")

    @field_validator("entries")
    @classmethod
    def _unique_ids(cls, value: list[PeakEntry]) -> list[PeakEntry]:
        seen: set[str] = set()
        for entry in value:
            if entry.id in seen:
                raise ValueError(f"duplicate entry id {entry.id!r}")
            seen.add(entry.id)
        return value


def default_peaks_path() -> Path:
    return matrices_file("peaks.yaml")


def parse_peaks(text: str, filename: str) -> PeaksFile:
    """Validate peaks YAML ``text``; errors name ``filename:line``."""
    return parse_model(text, filename, PeaksFile, PeaksError)


def load_peaks(path: Path | str | None = None) -> PeaksFile:
    """The shipped ``matrices/peaks.yaml``, or ``path``."""
    return load_model(Path(path) if path else default_peaks_path(), PeaksFile, PeaksError)


@dataclass(frozen=True)
class Peak:
    """The figures efficiencies are computed against (SI units)."""

    device: str
    entry: str
    source: str
    verified: bool
    flops: Mapping[str, float] = field(default_factory=dict)
    memory_bw: float | None = None
    host_link_bw: float | None = None
    interconnect_bw: float | None = None
    derivation: tuple[str, ...] = ()
    memory_bw_basis: str = "spec"
    """'spec' (a datasheet figure), 'measured' (an achievable reference measured here), or 'unknown'."""
    notes: str = ""

    @property
    def network_bw(self) -> float | None:
        """Ceiling for collectives' busbw: the device interconnect, else the host link."""
        return self.interconnect_bw or self.host_link_bw

    def record(self) -> PeakRecord:
        """The contract's ``peak`` record (plus the memory basis and notes)."""
        return PeakRecord(device=self.device, entry=self.entry, source=self.source, verified=self.verified,
                          flops=dict(self.flops), memory_bw=self.memory_bw, host_link_bw=self.host_link_bw,
                          interconnect_bw=self.interconnect_bw, derivation=list(self.derivation),
                          memory_bw_basis=self.memory_bw_basis, notes=self.notes)

    def replace(self, **changes: Any) -> Peak:
        return dataclasses.replace(self, **changes)


def entry_to_peak(entry: PeakEntry, device_name: str) -> Peak:
    return Peak(device=device_name, entry=entry.id, source=entry.source, verified=entry.verified,
                flops={k: v * 1e12 for k, v in entry.dense_tflops.items()},
                memory_bw=entry.memory_gbps * 1e9 if entry.memory_gbps else None,
                host_link_bw=entry.host_link_gbps * 1e9 if entry.host_link_gbps else None,
                interconnect_bw=entry.interconnect_gbps * 1e9 if entry.interconnect_gbps else None,
                memory_bw_basis="spec" if entry.memory_gbps else "unknown", notes=entry.notes)


def find_entry(peaks: PeaksFile, backend_name: str, device_name: str) -> PeakEntry | None:
    """First entry (file order) for this backend whose regex is found in ``device_name``."""
    for entry in peaks.entries:
        if backend_name in entry.backends and re.search(entry.match, device_name, re.IGNORECASE):
            return entry
    return None


def roofline(flops: float | None, bytes_moved: float | None, peak: Peak | None,
             dtype: str | None) -> tuple[float | None, float | None, Bound | None]:
    """(arithmetic intensity, ridge point, bound) of a problem on a device.

    Intensity = flops / bytes (None for a pure copy). Ridge point = the dtype's peak FLOP/s
    ÷ peak memory bandwidth: below it the memory system cannot feed the arithmetic units,
    so the problem is ``memory``-bound, at or above it ``compute``-bound. A copy (no flops)
    is memory-bound by definition. None where the peak lacks a figure the answer needs.
    """
    ai = flops / bytes_moved if flops is not None and bytes_moved else None
    if peak is None:
        return ai, None, None
    peak_flops = peak.flops.get(dtype) if dtype else None
    ridge = peak_flops / peak.memory_bw if peak_flops and peak.memory_bw else None
    if flops is None:
        return None, ridge, "memory" if peak.memory_bw else None
    if ai is None or ridge is None:
        return ai, ridge, None
    return ai, ridge, "compute" if ai >= ridge else "memory"


def efficiency(bound: Bound | None, peak: Peak | None, dtype: str | None, flops_per_s: float | None,
               bytes_per_s: float | None) -> float | None:
    """Achieved ÷ peak of the resource that bounds the problem; None without that peak.

    compute → FLOP/s over the dtype's peak; memory → bytes/s over memory bandwidth; link →
    bytes/s over the host link; network → (bus) bytes/s over the device interconnect.
    """
    if peak is None or bound is None:
        return None
    if bound == "compute":
        ceiling, achieved = (peak.flops.get(dtype) if dtype else None), flops_per_s
    else:
        ceiling = {"memory": peak.memory_bw, "link": peak.host_link_bw, "network": peak.network_bw}[bound]
        achieved = bytes_per_s
    if not ceiling or achieved is None:
        return None
    return achieved / ceiling


def fmt_rate(value: float | None, unit: str = "FLOP/s") -> str:
    """Human rate: 3.33e11 → '333 GFLOP/s'."""
    if value is None:
        return "n/a"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"
