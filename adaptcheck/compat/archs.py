"""The ``arch_supported`` rule type: does the installed torch build carry kernels for this
device's architecture (CUDA ``sm_XY`` / ROCm ``gfx`` targets)?

The compatibility models and the published build lists: docs/matrix.md (Rules) and
matrices/README.md.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from adaptcheck.base.schemas.matrix_evidence import ArchCompared
from adaptcheck.compat.rulebase import Evaluation, RuleBase, RuleInputs, Strict
from adaptcheck.compat.stackkeys import fits, label, stack_value, target_text, validate_constraints

_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([a-z]?)$")


class Build(Strict):
    """A published torch build and the architectures it ships kernels for."""

    versions: dict[str, str] = Field(min_length=1, description="Constraint key → constraint identifying the build "
                                     "(e.g. torch: '==2.7.*', runtime.cuda: '==12.8').")
    archs: list[str] = Field(min_length=1, description="Architectures the build ships (get_arch_list() form).")
    source: str | None = Field(default=None, description="Where this build's list is published, when not the rule's.")

    @field_validator("versions")
    @classmethod
    def _constraints(cls, v: dict[str, str]) -> dict[str, str]:
        return validate_constraints(v)


class ArchSupportedRule(RuleBase):
    type: Literal["arch_supported"]
    compatibility: Literal["cuda", "exact"] = Field(description="How an architecture in the list covers a device "
                                                    "(module doc): 'cuda' binary/PTX compatibility, 'exact' ROCm gfx.")
    builds: list[Build] = Field(default_factory=list, description="Published arch lists per torch build.")


def normalise(arch: str) -> str:
    """``gfx942:sramecc+:xnack-`` → ``gfx942``; ``SM_90`` → ``sm_90``."""
    return arch.strip().lower().split(":", 1)[0]


def covers(archs: list[str], device: str, compatibility: str) -> Literal["native", "ptx", "no"]:
    """How ``archs`` covers the ``device`` architecture."""
    device = normalise(device)
    names = [normalise(a) for a in archs]
    if device in names:
        return "native"
    if compatibility == "exact":
        return "no"
    dev = _ARCH.match(device)
    if dev is None:
        return "no"
    major, minor = int(dev.group(2)), int(dev.group(3))
    ptx = False
    for name in names:
        m = _ARCH.match(name)
        if m is None:
            continue
        a_major, a_minor = int(m.group(2)), int(m.group(3))
        if m.group(4):  # arch-specific code (sm_90a) runs on exactly that capability only
            if m.group(1) == "sm" and (a_major, a_minor) == (major, minor):
                return "native"
            continue
        if m.group(1) == "sm" and a_major == major and a_minor <= minor:
            return "native"
        if m.group(1) == "compute" and (a_major, a_minor) <= (major, minor):
            ptx = True
    return "ptx" if ptx else "no"


def _build_matches(build: Build, inp: RuleInputs) -> bool:
    for key, constraint in build.versions.items():
        value = stack_value(inp.env, key)
        if value is None or not fits(constraint, value):
            return False
    return True


def _describe(build: Build) -> str:
    return ", ".join(f"{label(key)} {target_text(c)}" for key, c in build.versions.items())


def evaluate_arch(rule: ArchSupportedRule, inp: RuleInputs) -> Evaluation:
    """The verdict for the captured device architecture and torch arch list."""
    device = inp.env.device_arch
    archs = list(inp.env.torch_archs)
    compared = ArchCompared(device_arch=device, torch=inp.env.torch, torch_archs=archs)
    if not device:
        return Evaluation("not_applicable", "no device architecture was captured (no device, or torch cannot "
                          "query it)", compared)
    origin = "the installed build's arch list"
    if not archs:
        published = next((b for b in rule.builds if _build_matches(b, inp)), None)
        if published is None:
            return Evaluation("warn", f"warning: the installed torch's arch list was not captured and no published "
                              f"list matches torch {inp.env.torch}: {device} support is unknown", compared)
        archs, origin = list(published.archs), f"the published arch list of {_describe(published)}"
        compared.torch_archs_published = archs
    how = covers(archs, device, rule.compatibility)
    compared.coverage = how
    if how == "native":
        return Evaluation("ok", f"torch {inp.env.torch} ships kernels for {device} ({origin})", compared)
    advice = [f"torch {inp.env.torch} → a build with {normalise(device)}: {_describe(b)}"
              for b in rule.builds if covers(b.archs, device, rule.compatibility) == "native"][:3]
    if how == "ptx":
        return Evaluation("warn", f"warning: torch {inp.env.torch} has no {normalise(device)} kernels, only PTX "
                          f"that the driver JIT-compiles at start ({origin}); arch-specific kernels are missing",
                          compared, advice)
    return Evaluation("incompatible", f"torch {inp.env.torch} ships no kernels for {normalise(device)} ({origin}: "
                      f"{' '.join(archs)}): kernels fail with 'no kernel image is available'", compared, advice)
