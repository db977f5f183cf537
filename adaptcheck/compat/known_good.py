"""Known-good stacks (``matrices/known_good.yaml`` plus ``$ADAPTCHECK_KNOWN_GOOD`` files) and
matching a captured environment to them, or to the nearest one with the changes that reach it.

Matching and site files: docs/matrix.md (Known-good stacks) and matrices/README.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adaptcheck.base.schemas.environment import Environment
from adaptcheck.base.yamldata import MatrixError, load_model, matrices_file
from adaptcheck.compat.stackkeys import (
    change_text,
    fits,
    stack_value,
    validate_backend,
    validate_constraints,
)

KNOWN_GOOD_ENV = "ADAPTCHECK_KNOWN_GOOD"
"""Environment variable listing site known-good files read in addition to the base file."""

class KnownGoodEntry(BaseModel):
    """One stack known to work."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="Entry id.")
    description: str = Field(min_length=1, description="The stack in words.")
    backend: str = Field(description="adaptcheck backend name ('cpu', 'cuda', 'ascend' …).")
    arch: str | None = Field(default=None, description="Machine architecture (uname -m); None = any.")
    device: str | None = Field(default=None, description="Regex searched in every device name; None = any.")
    versions: dict[str, str] = Field(default_factory=dict, description="Constraint key → specifier or 're:…'.")
    source: str = Field(min_length=1, description="Where the claim comes from (URL and section, or the runs).")
    date: str = Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$",
                      description="When the source was read or the stack measured (YYYY-MM or YYYY-MM-DD).")
    basis: Literal["measured", "published"] = Field(
        description="'measured': run by adaptcheck's maintainers; 'published': a vendor/project release pin.")

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        return validate_backend(v)

    @field_validator("device")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"device is not a valid regex: {exc}") from None
        return v

    @field_validator("versions")
    @classmethod
    def _constraints(cls, v: dict[str, str]) -> dict[str, str]:
        return validate_constraints(v)


class KnownGoodFile(BaseModel):
    """A whole ``known_good.yaml``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1]
    entries: list[KnownGoodEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> KnownGoodFile:
        ids = [e.id for e in self.entries]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate entry ids: {', '.join(dup)}")
        return self


def load_known_good(path: Path | None = None) -> KnownGoodFile:
    """The shipped known-good stacks, or those of ``path``. Raises MatrixError naming file:line."""
    return load_model(path or matrices_file("known_good.yaml"), KnownGoodFile)


def extra_known_good_files(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The files ``$ADAPTCHECK_KNOWN_GOOD`` lists, in order (empty parts ignored)."""
    value = (os.environ if environ is None else environ).get(KNOWN_GOOD_ENV, "")
    return [Path(part) for part in value.split(os.pathsep) if part.strip()]


@dataclass
class KnownGoodSources:
    """Entries of several known-good files, in reading order, and which file each came from."""

    known: KnownGoodFile
    files: list[Path]
    origin: dict[str, Path]


def load_known_good_sources(path: Path | None = None, extra: Sequence[Path] = ()) -> KnownGoodSources:
    """The base file (shipped, or ``path``) followed by every ``extra`` file.

    Entry ids must stay unique across files: two files claiming the same id would make the
    check's verdict depend on reading order, so that is an error naming both files.
    """
    base = path or matrices_file("known_good.yaml")
    files = [base, *extra]
    entries: list[KnownGoodEntry] = []
    origin: dict[str, Path] = {}
    for file in files:
        for entry in load_model(file, KnownGoodFile).entries:
            if entry.id in origin:
                raise MatrixError(f"{file}: known-good entry id {entry.id!r} is also defined in {origin[entry.id]}",
                                  hint="give site entries their own ids (export-known-good --prefix)")
            origin[entry.id] = file
            entries.append(entry)
    return KnownGoodSources(KnownGoodFile(schema_version=1, entries=entries), files, origin)


@dataclass(frozen=True)
class Difference:
    """One way the stack differs from an entry; ``change`` is the fix when it is a version."""

    text: str
    change: str | None = None


def _differences(env: Environment, entry: KnownGoodEntry) -> list[Difference]:
    diffs: list[Difference] = []
    if env.backend != entry.backend:
        diffs.append(Difference(f"backend is {env.backend}, entry wants {entry.backend}"))
    if entry.arch and env.arch != entry.arch:
        diffs.append(Difference(f"arch is {env.arch}, entry wants {entry.arch}"))
    if entry.device:
        names = [d.name for d in env.accelerators]
        bad = [n for n in names if not re.search(entry.device, n)]
        if not names:
            diffs.append(Difference(f"no device found, entry wants /{entry.device}/"))
        elif bad:
            diffs.append(Difference(f"device {bad[0]!r} does not match /{entry.device}/"))
    for key, constraint in entry.versions.items():
        value = stack_value(env, key)
        if value is None:
            diffs.append(Difference(f"{key} is absent, entry wants {constraint}", change_text(key, None, constraint)))
        elif not fits(constraint, value):
            diffs.append(Difference(f"{key} is {value}, entry wants {constraint}", change_text(key, value, constraint)))
    return diffs


def differences(env: Environment, entry: KnownGoodEntry) -> list[str]:
    """Everything in which ``env`` differs from ``entry`` (empty = match)."""
    return [d.text for d in _differences(env, entry)]


@dataclass
class MatchResult:
    """The matching entry, or the nearest one, how it differs and what to change to reach it."""

    matched: bool
    entry: KnownGoodEntry | None
    differences: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    """The version changes that reach ``entry`` (``torch-npu 2.5.1 → 2.5.1.post1``); empty when
    the machine itself differs (backend, arch, device), which no install can change."""

    def advice(self) -> str | None:
        """One line: the nearest known-good stack and the smallest set of changes to it."""
        if self.matched or self.entry is None:
            return None
        where = f"nearest known-good stack {self.entry.id!r} ({self.entry.basis}, {self.entry.date})"
        if self.changes and len(self.changes) == len(self.differences):
            return f"{where}: change {', '.join(self.changes)}"
        return f"{where} needs other hardware: {'; '.join(self.differences)}"


def match_known_good(env: Environment, known: KnownGoodFile) -> MatchResult:
    """First matching entry; otherwise the nearest: same backend, arch and device first (only
    versions to change), then fewest differences."""
    scored: list[tuple[tuple[int, int, int], KnownGoodEntry, list[Difference]]] = []
    for entry in known.entries:
        diffs = _differences(env, entry)
        if not diffs:
            return MatchResult(True, entry)
        machine = sum(d.change is None for d in diffs)
        scored.append(((0 if entry.backend == env.backend else 1, machine, len(diffs)), entry, diffs))
    _, entry, diffs = min(scored, key=lambda s: s[0])
    return MatchResult(False, entry, [d.text for d in diffs], [d.change for d in diffs if d.change])
