"""Version arithmetic shared by the rules and the known-good matcher (``packaging``, PEP 440 /
PEP 508).

The two deliberate choices (pre-releases count, local labels are build flavours):
docs/matrix.md (Version arithmetic).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from adaptcheck.base.schemas.environment import Environment

RequiresLookup = Callable[[str], "list[str] | None"]
"""Distribution name → its Requires-Dist lines, or None when it is not installed."""

Fit = Literal["yes", "build_label", "no", "unparseable"]


def canonical(name: str) -> str:
    """PEP 503 name: 'torch_npu', 'Torch-NPU' → 'torch-npu'."""
    return canonicalize_name(name)


def parse(text: str | None) -> Version | None:
    """A PEP 440 version or None (driver strings like '535.104.05' parse fine)."""
    if not text:
        return None
    try:
        return Version(text.strip())
    except InvalidVersion:
        return None


def distribution_requires(name: str) -> list[str] | None:
    """Requires-Dist of an installed distribution (default :data:`RequiresLookup`)."""
    try:
        return list(metadata.requires(name) or [])
    except metadata.PackageNotFoundError:
        return None


def distribution_version(name: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def requirement_name(line: str) -> str | None:
    """Canonical name a Requires-Dist line is about, or None when it does not parse."""
    try:
        return canonical(Requirement(line).name)
    except InvalidRequirement:
        return None


def installed_versions(env: Environment) -> dict[str, str | None]:
    """Every version the environment knows, by canonical distribution name."""
    out: dict[str, str | None] = {}
    for name, version in env.torch_device_extension.items():
        out[canonical(name)] = version
    for name, version in env.packages.items():
        out[canonical(name)] = version
    out["torch"] = env.torch
    return out


@dataclass(frozen=True)
class AppliedRequirement:
    """What one distribution requires of another, after markers are evaluated."""

    spec: SpecifierSet
    lines: tuple[str, ...]


def requirement_on(requires: list[str], target: str) -> AppliedRequirement | None:
    """The combined requirement of ``requires`` on ``target`` for this machine, or None.

    Lines behind an extra (``; extra == "tensorizer"``) or a marker that does not hold here
    (``; platform_machine == "aarch64"`` on x86_64) do not apply and are left out; several
    applying lines are combined (all must hold).
    """
    want = canonical(target)
    specs: list[str] = []
    lines: list[str] = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonical(req.name) != want:
            continue
        if req.marker is not None and not _marker_holds(req):
            continue
        lines.append(line)
        if str(req.specifier):
            specs.append(str(req.specifier))
    if not lines:
        return None
    return AppliedRequirement(SpecifierSet(",".join(specs)), tuple(lines))


def _marker_holds(req: Requirement) -> bool:
    """Whether the requirement's marker holds on this machine, outside any extra.

    A marker packaging cannot evaluate counts as holding: better to check a requirement
    that might not apply than to skip one that does.
    """
    assert req.marker is not None
    try:
        return bool(req.marker.evaluate({"extra": ""}))
    except Exception:  # noqa: BLE001 - unknown marker variables raise various errors
        return True


def _without_local(spec: SpecifierSet) -> SpecifierSet:
    parts = []
    for s in spec:
        version = s.version.split("+", 1)[0]
        parts.append(f"{s.operator}{version}")
    return SpecifierSet(",".join(parts))


def check(spec: SpecifierSet, version: str | None) -> Fit:
    """How ``version`` fits ``spec`` (see module doc for ``build_label``)."""
    v = parse(version)
    if v is None:
        return "unparseable"
    if spec.contains(v, prereleases=True):
        return "yes"
    if _without_local(spec).contains(Version(v.public), prereleases=True):
        return "build_label"
    return "no"


def valid_specifier(text: str) -> str:
    """Validate a specifier string (for pydantic validators); returns it unchanged."""
    try:
        SpecifierSet(text)
    except InvalidSpecifier as exc:
        raise ValueError(f"not a PEP 440 version specifier: {text!r} ({exc})") from None
    return text


__all__ = [
    "AppliedRequirement", "Fit", "RequiresLookup", "canonical", "check", "distribution_requires",
    "distribution_version", "installed_versions", "parse", "requirement_name", "requirement_on", "valid_specifier",
]
