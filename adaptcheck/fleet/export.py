"""Export combinations that reached L4+ as known-good entries (``matrices/known_good.yaml`` schema).

An entry pins exactly what the combination ran: ``==`` on every key version (``re:`` with
the value escaped where it is not a normal PEP 440 version, e.g. CANN's ``8.0.RC2``), the backend,
the architecture and an anchored, escaped regex of the device names. Before anything is
written each entry must match the environment of the run it came from
(:func:`adaptcheck.compat.known_good.differences` is empty) — an entry that would not
even match its own machine is refused, not shipped — and the written file is read back
with :func:`load_known_good`, the loader the ``matrix.known_good`` check uses.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from adaptcheck.base.atomic import write_text_atomic
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.compat import versions as V
from adaptcheck.compat.known_good import (
    KnownGoodEntry,
    differences,
    load_known_good,
)
from adaptcheck.fleet.merge import merge
from adaptcheck.fleet.models import (
    KNOWN_GOOD_MIN_LEVEL,
    Combination,
    KnownGoodExport,
    Refusal,
)
from adaptcheck.fleet.stack import summary

_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")
HEADER = ("# Known-good stacks measured on this site, written by 'adaptcheck matrix export-known-good'.\n"
          "# Schema: matrices/README.md. Read by the matrix.known_good check when listed in\n"
          "# $ADAPTCHECK_KNOWN_GOOD. Re-exporting updates entries by id; comments are not kept.\n")


def pin(value: str) -> str:
    """An exact constraint on ``value``: '==<version>' when the text is already a normal PEP 440
    version, else 're:<value, escaped>'.

    PEP 440 would read CANN's '8.0.RC2' as the pre-release '8.0rc2' and a driver's
    '535.104.05' as '535.104.5'; a pin that rewrites the vendor's string is hard to check
    by eye, so those are pinned literally.
    """
    version = V.parse(value)
    if version is not None and str(version) == value:
        return f"=={value}"
    return "re:" + re.escape(value)


def device_regex(names: list[str]) -> str:
    """Every device name must be one of ``names``, matched whole and literally."""
    return "^(?:" + "|".join(re.escape(n) for n in names) + ")$"


def entry_id(prefix: str, row: Combination) -> str:
    """'site-cpu-x86_64-3f2a9c1b04de': unique per combination, stable across re-exports."""
    raw = f"{prefix}-{row.key.backend}-{row.key.arch}-{row.id}"
    return _ID_UNSAFE.sub("-", raw).strip("-")


def build_entry(row: Combination, latest: RunResults, prefix: str) -> KnownGoodEntry:
    """The known-good entry of one qualifying combination."""
    env = latest.environment
    assert env is not None  # merge only keeps runs with an environment
    hosts = ", ".join(row.hosts)
    runs = ", ".join(r.run_id for r in row.runs)
    # An entry measured from files nothing vouches for says so where its readers look: its source.
    unverified = [f"{r.run_id} ({'edited after the run' if r.integrity == 'edited' else 'no digest'})"
                  for r in row.runs if not r.verified]
    caveat = f"; UNVERIFIED results files: {', '.join(unverified)}" if unverified else ""
    source = (f"measured with adaptcheck {latest.adaptcheck_version}: latest run {row.latest_run_id} "
              f"({row.last_started.date().isoformat()}, ladder {latest.ladder.id} {latest.ladder.version}) graded "
              f"{row.latest_grade}; runs {runs} on hosts {hosts} "
              f"({row.first_started.date().isoformat()} to {row.last_started.date().isoformat()}){caveat}")
    return KnownGoodEntry(
        id=entry_id(prefix, row),
        description=f"{summary(row.key)}; measured {row.latest_grade} (adaptcheck matrix export-known-good)",
        backend=row.key.backend, arch=row.key.arch,
        # No device regex when the capture listed no device: it would demand one and never match.
        device=device_regex(sorted({d.name for d in env.accelerators})) if env.accelerators else None,
        versions={k: pin(v) for k, v in row.key.versions.items()},
        source=source, date=row.last_started.date().isoformat(), basis="measured",
    )


def _write(path: Path, entries: list[KnownGoodEntry]) -> None:
    """Write the file; it replaces ``path`` only once the check's own loader accepts it."""
    body = yaml.safe_dump({"schema_version": 1, "entries": [e.model_dump(mode="json", exclude_none=True) for e in entries]},
                          sort_keys=False, allow_unicode=True, width=100)
    write_text_atomic(path, HEADER + body, check=load_known_good, what="the known-good file")


def export_known_good(paths: Sequence[Path], output: Path, prefix: str = "site",
                      allow_unverified: bool = False) -> KnownGoodExport:
    """Merge ``paths`` and write every combination whose latest run reached L4+ into ``output``.

    An existing ``output`` must be a valid known-good file: its entries are kept and those
    with the same id are replaced (re-exporting refreshes the runs named in ``source``).
    Nothing is written when no combination qualifies. Edited or undigested inputs are skipped
    unless ``allow_unverified`` (an entry built from one then says so in its ``source``).
    """
    merged = merge(paths, allow_unverified)
    entries: list[KnownGoodEntry] = []
    refused: list[Refusal] = []
    for row in merged.matrix.rows:
        if not row.known_good:
            refused.append(Refusal(row=row.id, summary=summary(row.key), reason=row.known_good_reason))
            continue
        latest = merged.latest[row.id]
        entry = build_entry(row, latest, prefix)
        assert latest.environment is not None
        diffs = differences(latest.environment, entry)
        if diffs:
            refused.append(Refusal(row=row.id, summary=summary(row.key),
                                   reason="cannot be pinned so that it matches its own run: " + "; ".join(diffs)))
            continue
        entries.append(entry)
    kept = 0
    if entries:
        existing = load_known_good(output).entries if output.exists() else []
        new_ids = {e.id for e in entries}
        previous = [e for e in existing if e.id not in new_ids]
        kept = len(previous)
        _write(output, previous + entries)
    return KnownGoodExport(output=str(output) if entries else None, entries=entries, kept=kept, refused=refused,
                           skipped=merged.matrix.skipped)


__all__ = ["KNOWN_GOOD_MIN_LEVEL", "build_entry", "device_regex", "entry_id", "export_known_good", "pin"]
