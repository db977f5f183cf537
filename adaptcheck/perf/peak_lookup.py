"""Which peak a device is held to: the first matching ``peaks.yaml`` entry, or on the host
CPU the peak derived from the machine (:mod:`adaptcheck.perf.cpu_peak`) with a matching CPU
entry's figures on top (a datasheet memory bandwidth, say).

Its own module because it needs both :mod:`adaptcheck.perf.peaks` (the file and the
:class:`~adaptcheck.perf.peaks.Peak`) and :mod:`adaptcheck.perf.cpu_peak` (which builds a
``Peak`` itself): in either of them it would make the two import each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adaptcheck.backends.registry import backend_data_files
from adaptcheck.perf.cpu_peak import derive_cpu_peak, read_cpu_facts
from adaptcheck.perf.peaks import Peak, PeakEntry, PeaksFile, entry_to_peak, find_entry, load_peaks


def known_peaks(path: Path | str | None = None) -> PeaksFile:
    """``path``'s entries (an override replaces everything), else the shipped file's followed
    by every discovered backend's own (``Backend.peaks_file``: a plugin brings its devices'
    figures without editing ``matrices/peaks.yaml``)."""
    if path:
        return load_peaks(path)
    shipped = load_peaks()
    extra = [e for _, f in backend_data_files("peaks_file") for e in load_peaks(f).entries]
    return shipped.model_copy(update={"entries": [*shipped.entries, *extra]}) if extra else shipped


def peak_for(backend_name: str, device_name: str, path: Path | str | None = None, *, host_cpu: bool | None = None,
             cpu_facts: Any | None = None) -> Peak | None:
    """The peak for a device: the first matching ``peaks.yaml`` entry (or ``path``'s), or for
    the host CPU (``host_cpu``; default: the backend is named 'cpu') the derived peak
    (``cpu_facts``: recorded :class:`~adaptcheck.perf.cpu_peak.CpuFacts`, else read from this
    machine) with a matching CPU entry's figures on top. None when nothing is known."""
    entry = find_entry(known_peaks(path), backend_name, device_name)
    if not (host_cpu if host_cpu is not None else backend_name == "cpu"):
        return entry_to_peak(entry, device_name) if entry else None
    derived = derive_cpu_peak(cpu_facts if cpu_facts is not None else read_cpu_facts())
    return merge_cpu_entry(derived, entry) if entry else derived


def merge_cpu_entry(derived: Peak, entry: PeakEntry) -> Peak:
    """A CPU entry's figures replace the derived ones they name; the rest stay derived."""
    spec = entry_to_peak(entry, derived.device)
    flops = {**derived.flops, **spec.flops}
    lines = [*derived.derivation,
             f"peaks entry {entry.id!r} ({entry.source}) replaces: "
             + ", ".join([*(f"{k} flops" for k in spec.flops), *(["memory bandwidth"] if spec.memory_bw else [])])]
    return derived.replace(
        entry=f"derived:cpu+{entry.id}", flops=flops, derivation=tuple(lines), notes=entry.notes,
        memory_bw=spec.memory_bw or derived.memory_bw,
        interconnect_bw=spec.interconnect_bw or derived.interconnect_bw or spec.memory_bw,
        memory_bw_basis="spec" if spec.memory_bw else derived.memory_bw_basis,
        source=f"{derived.source}; {entry.source}", verified=derived.verified and entry.verified)
