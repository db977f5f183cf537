"""Compatibility rules as data (``matrices/rules.yaml`` and each backend's own rules file),
validated into one model per rule type at load time, and the evaluators that give each rule's
verdict, compared values and advice.

Rule types and their fields: matrices/README.md; verdicts and advice: docs/matrix.md (Rules).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from adaptcheck.base.schemas.matrix_evidence import (
    BackendsCompared,
    CudaCompared,
    DependenciesCompared,
    ExtensionCompared,
    PluginDistribution,
    PluginsCompared,
    RequirementCompared,
    RuleCompared,
)
from adaptcheck.base.yamldata import MatrixError, load_model, matrices_file
from adaptcheck.compat import versions as V
from adaptcheck.compat.archs import ArchSupportedRule, evaluate_arch
from adaptcheck.compat.rulebase import Evaluation, RuleBase, RuleInputs, Strict, VerdictName
from adaptcheck.compat.tables import VersionTableRule, evaluate_table

_SEVERITY = {"not_applicable": 0, "ok": 1, "warn": 2, "incompatible": 3}


# ---------------------------------------------------------------- schema ---------------
class MajorMinimum(Strict):
    major: int = Field(description="CUDA major release, e.g. 12.")
    min_driver: str = Field(description="Minimum driver for minor-version compatibility, e.g. '525.60.13'.")

    @field_validator("min_driver")
    @classmethod
    def _version(cls, v: str) -> str:
        if V.parse(v) is None:
            raise ValueError(f"not a version: {v!r}")
        return v


class ReleaseDriver(Strict):
    cuda: str = Field(description="CUDA toolkit release 'X.Y'.")
    driver: str = Field(description="Driver the release ships with (release-notes table).")


class CudaDriverRule(RuleBase):
    type: Literal["cuda_driver_minimum"]
    runtime: str = Field(default="cuda", description="Key of Environment.runtimes holding the CUDA version.")
    driver_runtime_key: str | None = Field(
        default=None, description="Key of Environment.runtimes with the driver, used when no device row reports it.")
    majors: list[MajorMinimum] = Field(min_length=1)
    releases: list[ReleaseDriver] = Field(default_factory=list, description="Optional: below these → warn.")


class RequirementRule(RuleBase):
    type: Literal["requirement"]
    requirer: list[str] = Field(min_length=1, description="Distributions, first installed one is used.")
    target: str = Field(description="Distribution whose installed version is checked.")
    on_mismatch: Literal["incompatible", "warn"] = "incompatible"


class PluginRule(RuleBase):
    type: Literal["plugin_requires_vllm"]
    vllm_distributions: list[str] = Field(min_length=1, description="Distributions that provide the vllm module.")


class ExtensionRule(RuleBase):
    type: Literal["extension_matches_torch"]
    extension: str = Field(description="Distribution name of the extension, e.g. 'torch-npu'.")
    match: Literal["release", "major_minor", "local_label"] = Field(
        description="Version scheme when no torch requirement is declared: 'release' (X.Y.Z equal), 'major_minor' "
                    "(X.Y equal), 'local_label' (the torch release named in the local label, '1.22.2+torch2.4.0').")


class DependenciesRule(RuleBase):
    type: Literal["dependencies_satisfied"]
    distributions: list[str] = Field(min_length=1, description="Distributions whose Requires-Dist must all hold.")
    known_absent: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Requirements a distribution declares but that are deliberately removed in a known-good "
                    "setup (distribution → names): their absence is a warning, not an incompatibility.")


RuleModel = (CudaDriverRule | RequirementRule | PluginRule | ExtensionRule | DependenciesRule | VersionTableRule
           | ArchSupportedRule)
Rule = Annotated[RuleModel, Field(discriminator="type")]


class RulesFile(Strict):
    """A whole ``rules.yaml``."""

    schema_version: Literal[1]
    rules: list[Rule] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> RulesFile:
        ids = [r.id for r in self.rules]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate rule ids: {', '.join(dup)}")
        return self


def load_rules(path: Path | None = None) -> RulesFile:
    """The rules of ``path``, else the shipped ones followed by every discovered backend's own
    (``Backend.rules_file``). Raises MatrixError naming file:line (a duplicate id included)."""
    if path is not None:
        return load_model(path, RulesFile)
    from adaptcheck.backends.registry import backend_data_files

    shipped = load_model(matrices_file("rules.yaml"), RulesFile)
    extra = [r for _, f in backend_data_files("rules_file") for r in load_model(f, RulesFile).rules]
    if not extra:
        return shipped
    try:
        return RulesFile(schema_version=1, rules=[*shipped.rules, *extra])
    except ValueError as exc:
        files = ", ".join(str(f) for _, f in backend_data_files("rules_file"))
        raise MatrixError(f"rules of the backends' own files ({files}) clash with matrices/rules.yaml: "
                          f"{str(exc).splitlines()[-1].strip()}") from None


# ---------------------------------------------------------------- evaluation -----------
@dataclass
class Verdict:
    """The result of one rule."""

    rule_id: str
    verdict: VerdictName
    message: str
    source: str
    compared: RuleCompared = field(default_factory=RuleCompared)
    error: str | None = None
    """Set when the rule could not be evaluated (an evaluator bug or unreadable metadata)."""
    advice: list[str] = field(default_factory=list)
    """When the verdict is not ok: the smallest changes that make the rule hold, alternatives
    each on its own (``cann 8.0.RC3 → 8.1.RC1``, or ``vllm-ascend 0.9.1 → 0.7.3``)."""


def _driver_tuple(text: str) -> tuple[int, ...]:
    """'535.104.05' → (535, 104, 5); compared as integers, as NVIDIA numbers them.
    Anything else raises ValueError (the rule then warns that it cannot read the driver)."""
    return tuple(int(p) for p in text.strip().split("."))


def _cuda(rule: CudaDriverRule, inp: RuleInputs) -> tuple[VerdictName, str, CudaCompared]:
    runtime = inp.env.runtimes.get(rule.runtime)
    driver = inp.env.driver_version or (inp.env.runtimes.get(rule.driver_runtime_key)
                                        if rule.driver_runtime_key else None)
    compared = CudaCompared(runtime=runtime, driver=driver)
    if not runtime:
        return "not_applicable", f"no {rule.runtime} runtime on this machine", compared
    rt = V.parse(runtime)
    if rt is None:
        return "warn", f"warning: {rule.runtime} runtime version {runtime!r} is not understood", compared
    row = next((m for m in rule.majors if m.major == rt.major), None)
    if row is None:
        known = ", ".join(str(m.major) for m in rule.majors)
        return "warn", f"warning: no driver table for CUDA {rt.major}.x (table covers {known})", compared
    compared.required_driver = f">={row.min_driver}"
    if not driver:
        return "warn", f"warning: CUDA {runtime} needs driver >= {row.min_driver}, but the driver version is unknown", compared
    try:
        have, need = _driver_tuple(driver), _driver_tuple(row.min_driver)
    except ValueError:
        return "warn", f"warning: driver version {driver!r} is not understood", compared
    if have < need:
        message = (f"CUDA {runtime} needs driver >= {row.min_driver}, found {driver} "
                   "(unless the CUDA forward-compatibility package is installed)")
        return "incompatible", message, compared
    release = next((r for r in rule.releases if r.cuda == f"{rt.major}.{rt.minor}"), None)
    if release is not None and have < _driver_tuple(release.driver):
        compared.release_driver = release.driver
        message = (f"warning: CUDA {runtime} runs on driver {driver} through minor-version compatibility "
                   f"(its release driver is {release.driver}); PTX JIT and newer driver features are unavailable")
        return "warn", message, compared
    return "ok", f"driver {driver} supports CUDA {runtime} (needs >= {row.min_driver})", compared


def _requirement_verdict(who: str, spec: V.AppliedRequirement, target: str, version: str | None,
                         on_mismatch: VerdictName) -> tuple[VerdictName, str]:
    wanted = str(spec.spec) or "(any version)"
    if version is None:
        return "incompatible", f"{who} requires {target} {wanted}, which is not installed"
    fit = V.check(spec.spec, version)
    if fit == "yes":
        return "ok", f"{who} requires {target} {wanted}; {version} is installed"
    if fit == "build_label":
        return "warn", (f"warning: {who} requires {target} {wanted}; {version} is the same release but another "
                        "build (local version label differs)")
    if fit == "unparseable":
        return "warn", f"warning: installed {target} version {version!r} is not a PEP 440 version"
    prefix = "warning: " if on_mismatch == "warn" else ""
    return on_mismatch, f"{prefix}{who} requires {target} {wanted}, but {version} is installed"


def _requirement(rule: RequirementRule, inp: RuleInputs) -> tuple[VerdictName, str, RequirementCompared]:
    found = inp.first_installed(rule.requirer)
    compared = RequirementCompared(requirer=None, target=rule.target, installed=inp.version_of(rule.target))
    if found is None:
        return "not_applicable", f"{' / '.join(rule.requirer)} not installed", compared
    dist, version = found
    compared.requirer = f"{dist} {version}"
    requires = inp.requires(dist)
    if requires is None:
        return "warn", f"warning: no metadata for {dist} (cannot read its requirements)", compared
    spec = V.requirement_on(requires, rule.target)
    if spec is None:
        return "not_applicable", f"{dist} {version} declares no requirement on {rule.target}", compared
    compared.requirement = list(spec.lines)
    verdict, message = _requirement_verdict(f"{dist} {version}", spec, rule.target, compared.installed,
                                            rule.on_mismatch)
    return verdict, message, compared


def _plugins(rule: PluginRule, inp: RuleInputs) -> tuple[VerdictName, str, PluginsCompared]:
    dists: dict[str, PluginDistribution] = {}
    for p in inp.env.vllm_plugins:
        if p.distribution:
            entry = dists.setdefault(p.distribution, PluginDistribution(
                distribution=p.distribution, version=p.distribution_version, requires=p.requires, plugins=[],
                allowed=False))
            entry.plugins.append(f"{p.group}:{p.name}")
            entry.allowed = entry.allowed or p.allowed
    vllm = inp.first_installed(rule.vllm_distributions)
    compared = PluginsCompared(vllm=f"{vllm[0]} {vllm[1]}" if vllm else None, plugins=[])
    if not dists:
        return "not_applicable", "no vLLM plugin distribution installed", compared
    if vllm is None:
        compared.plugins = [e for _, e in sorted(dists.items())]
        return "not_applicable", f"vLLM is not installed, so its plugins ({', '.join(sorted(dists))}) are not used", compared
    worst: VerdictName = "ok"
    lines: list[str] = []
    for name, e in sorted(dists.items()):
        spec = V.requirement_on(e.requires, "vllm")
        who = f"{name} {e.version}"
        verdict: VerdictName
        if spec is None:
            verdict, message = "warn", f"warning: {who} declares no requirement on vllm"
        else:
            verdict, message = _requirement_verdict(who, spec, "vllm", vllm[1], "incompatible")
        if not e.allowed:
            verdict, message = "ok", f"{who} is excluded by VLLM_PLUGINS (not loaded): {message}"
        compared.plugins.append(e.model_copy(update={"requirement": list(spec.lines) if spec else [],
                                                     "verdict": verdict}))
        if _SEVERITY[verdict] > _SEVERITY[worst]:
            worst = verdict
        lines.append(message.removeprefix("warning: "))
    if vllm[0] != "vllm":
        lines.append(f"vllm module provided by {vllm[0]}")
    prefix = "warning: " if worst == "warn" else ""
    return worst, prefix + "; ".join(lines), compared


def _extension(rule: ExtensionRule, inp: RuleInputs) -> tuple[VerdictName, str, ExtensionCompared] | Evaluation:
    ext = inp.version_of(rule.extension)
    torch = inp.env.torch
    compared = ExtensionCompared(extension=rule.extension, extension_version=ext, torch=torch)
    if ext is None:
        return "not_applicable", f"{rule.extension} not installed", compared
    requires = inp.requires(rule.extension) or []
    spec = V.requirement_on(requires, "torch")
    if spec is not None:
        compared.requirement = list(spec.lines)
        verdict, message = _requirement_verdict(f"{rule.extension} {ext}", spec, "torch", torch, "incompatible")
        return verdict, message, compared
    if torch is None:
        return "incompatible", f"{rule.extension} {ext} is installed but torch is not", compared
    ev, tv = V.parse(ext), V.parse(torch)
    if rule.match == "local_label":
        # torch_mlu 1.22.2+torch2.4.0 (or 1.24.0-torch2.1.0, not PEP 440): the extension's own
        # release says nothing about torch, its label names the torch release.
        named = re.search(r"[+-]torch(\d+(?:\.\d+)*)", ext)
        ev = V.parse(named.group(1)) if named else None
    if ev is None or tv is None:
        return "warn", f"warning: cannot compare {rule.extension} {ext} with torch {torch}", compared
    width = 2 if rule.match == "major_minor" else 3
    want, have = ev.release[:width], tv.release[:width]
    compared.match = rule.match
    shown = ".".join(map(str, want))
    if want == have:
        return "ok", f"{rule.extension} {ext} is built for torch {shown}; torch {torch} is installed", compared
    return Evaluation("incompatible", f"{rule.extension} {ext} is built for torch {shown}, but torch {torch} is "
                      "installed", compared, [f"torch {torch} → {shown}" + ("" if width == 3 else ".*"),
                                              f"or {rule.extension} {ext} → the build for torch {tv.base_version}"])


def _dependencies(rule: DependenciesRule, inp: RuleInputs) -> tuple[VerdictName, str, DependenciesCompared]:
    checked: dict[str, str] = {}
    problems: list[str] = []
    labels: list[str] = []
    for dist in rule.distributions:
        version = inp.version(dist)
        requires = inp.requires(dist) if version is not None else None
        if version is None or requires is None:
            continue
        checked[dist] = version
        for target in sorted({n for line in requires if (n := V.requirement_name(line))}):
            spec = V.requirement_on(requires, target)
            if spec is None:
                continue  # behind an extra or a marker that does not hold here
            have = inp.version(target)
            if have is None and target in rule.known_absent.get(dist, []):
                labels.append(f"{dist} {version} declares {target}, deliberately not installed (known workaround)")
                continue
            verdict, message = _requirement_verdict(f"{dist} {version}", spec, target, have, "incompatible")
            if verdict == "incompatible":
                problems.append(message)
            elif verdict == "warn":
                labels.append(message.removeprefix("warning: "))
    compared = DependenciesCompared(distributions=checked, unmet=problems, build_label_differences=labels)
    if not checked:
        return "not_applicable", f"none of {', '.join(rule.distributions)} is installed", compared
    if problems:
        return "incompatible", "; ".join(problems), compared
    if labels:
        return "warn", "warning: " + "; ".join(labels), compared
    names = ", ".join(f"{d} {v}" for d, v in checked.items())
    return "ok", f"every declared dependency of {names} is installed in a fitting version", compared


def _dispatch(rule: RuleModel, inputs: RuleInputs) -> tuple[VerdictName, str, RuleCompared] | Evaluation:
    """The evaluator of the rule's type (the union is closed: the loader accepts no other)."""
    if isinstance(rule, CudaDriverRule):
        return _cuda(rule, inputs)
    if isinstance(rule, RequirementRule):
        return _requirement(rule, inputs)
    if isinstance(rule, PluginRule):
        return _plugins(rule, inputs)
    if isinstance(rule, ExtensionRule):
        return _extension(rule, inputs)
    if isinstance(rule, DependenciesRule):
        return _dependencies(rule, inputs)
    if isinstance(rule, VersionTableRule):
        return evaluate_table(rule, inputs)
    return evaluate_arch(rule, inputs)


def evaluate(rule: RuleModel, inputs: RuleInputs) -> Verdict:
    """Evaluate one rule. A rule that cannot be evaluated says so in ``error`` (never an ``ok``),
    without stopping the other rules."""
    if rule.backends and inputs.env.backend not in rule.backends:
        return Verdict(rule.id, "not_applicable", f"a rule for {', '.join(rule.backends)}; this machine's backend is "
                       f"{inputs.env.backend}", rule.source, BackendsCompared(backends=rule.backends))
    try:
        found = _dispatch(rule, inputs)
    except Exception as exc:  # noqa: BLE001 - one odd metadata entry must not hide the other rules
        why = f"{type(exc).__name__}: {exc}"
        return Verdict(rule.id, "not_applicable", f"rule could not be evaluated: {why}", rule.source, RuleCompared(),
                       error=why)
    ev = found if isinstance(found, Evaluation) else Evaluation(*found)
    return Verdict(rule.id, ev.verdict, ev.message, rule.source, ev.compared,
                   advice=ev.advice if ev.verdict != "ok" else [])


def evaluate_all(rules: RulesFile, inputs: RuleInputs) -> list[Verdict]:
    """Every rule, in file order."""
    return [evaluate(r, inputs) for r in rules.rules]
