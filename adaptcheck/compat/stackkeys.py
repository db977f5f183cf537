"""Named parts of a captured stack (``torch``, ``runtime.<name>``, ``package.<dist>`` …) and
version constraints on them, shared by ``version_table`` rules and known-good entries.

Keys and constraint syntax: matrices/README.md (known_good.yaml).
"""

from __future__ import annotations

import functools
import re

from packaging.specifiers import SpecifierSet

from adaptcheck.base.schemas.environment import Environment
from adaptcheck.compat import versions as V

KEY = re.compile(r"^(torch|python|driver|firmware|(runtime|package|extension)\.[A-Za-z0-9_.\-]+)$")
KEY_HELP = "torch, python, driver, firmware, runtime.<name>, package.<dist>, extension.<dist>"


def validate_key(key: str) -> str:
    """``key`` unchanged, or ValueError naming the valid forms (for pydantic validators)."""
    if not KEY.match(key):
        raise ValueError(f"unknown constraint key {key!r} ({KEY_HELP})")
    return key


def validate_constraint(value: str) -> str:
    """``value`` unchanged when it is a PEP 440 specifier or a valid ``re:`` regex, else ValueError."""
    if value.startswith("re:"):
        try:
            re.compile(value[3:])
        except re.error as exc:
            raise ValueError(f"invalid regex {value!r}: {exc}") from None
        return value
    return V.valid_specifier(value)


def validate_constraints(constraints: dict[str, str]) -> dict[str, str]:
    """A key → constraint mapping unchanged when every key and constraint is valid, else a
    ValueError naming the key (for pydantic validators of entries and builds)."""
    for key, value in constraints.items():
        validate_key(key)
        try:
            validate_constraint(value)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    return constraints


def stack_value(env: Environment, key: str) -> str | None:
    """The captured value a constraint key refers to (None = absent)."""
    if key == "torch":
        return env.torch
    if key == "python":
        return env.python
    if key == "driver":
        return env.driver_version
    if key == "firmware":
        return env.firmware_version
    kind, _, name = key.partition(".")
    if kind == "runtime":
        return env.runtimes.get(name)
    return V.installed_versions(env).get(V.canonical(name))


_LEADING_VERSION = re.compile(r"^[vV]?(\d+(?:\.\d+)*)")


def comparable(value: str) -> str:
    """``value`` as a specifier can compare it: unchanged when PEP 440 reads it, else its leading
    numeric release. Vendor tools print ``v6.2.29`` (cnmon), ``3.3.5-server`` (mthreads-gmi),
    ``6.3.27-V1.2.5`` (hy-smi): each compares as its release (``v6.2.29`` and ``3.13.5-1`` are
    already PEP 440: a leading v, a post-release)."""
    if V.parse(value) is not None:
        return value
    m = _LEADING_VERSION.match(value.strip())
    return m.group(1) if m else value


def fits(constraint: str, value: str) -> bool:
    """Whether the captured ``value`` satisfies ``constraint`` (a local build label such as
    ``+cu124`` is a flavour: ``2.5.1+cu124`` satisfies ``==2.5.1``; a regex sees the string as
    captured, a specifier its :func:`comparable` release)."""
    if constraint.startswith("re:"):
        return re.fullmatch(constraint[3:], value) is not None
    return V.check(SpecifierSet(constraint), comparable(value)) == "yes"


def label(key: str) -> str:
    """How advice names a key: ``runtime.cann`` → ``cann``, ``extension.torch-npu`` → ``torch-npu``."""
    return key.partition(".")[2] or key


def target_text(constraint: str) -> str:
    """The version a constraint asks for, as a person would write it: ``==2.5.1`` → ``2.5.1``,
    ``>=525.60.13`` stays, a regex is shown as the pattern it is."""
    if constraint.startswith("re:"):
        return f"/{constraint[3:]}/"
    spec = constraint.strip()
    if spec.startswith("==") and "," not in spec and not spec.startswith("==="):
        return spec[2:]
    return spec


def change_text(key: str, have: str | None, constraint: str) -> str:
    """One change of advice: ``cann 8.0.RC3 → 8.1.RC1`` (``install …`` when absent)."""
    if have is None:
        return f"install {label(key)} {target_text(constraint)}"
    return f"{label(key)} {have} → {target_text(constraint)}"


@functools.lru_cache(maxsize=1)
def backend_names() -> tuple[str, ...]:
    """Every discovered backend name (shipped and plugins), read once per process: a data file
    names dozens of backends and the entry points do not change under a running process."""
    from adaptcheck.backends.registry import discover  # lazily: reading the data needs no backend otherwise

    return tuple(sorted(discover()))


def validate_backend(name: str) -> str:
    """``name`` unchanged when a backend of that name is discovered (shipped or plugin), else
    ValueError with "did you mean": an entry or rule for a misspelt backend would never apply."""
    from adaptcheck.base.errors import did_you_mean

    known = backend_names()
    if name not in known:
        raise ValueError(f"unknown backend {name!r}: {did_you_mean(name, known)}")
    return name
