"""Typed evidence of the step-1 compatibility-matrix checks (``matrix.*``): one model per kind.

The checks build their ``details`` through these models and readers (the report's matrix
section, ``adaptcheck env --check``) get them back typed. What each rule type compares, and
the known-good files, are described in docs/compatibility.md.
"""

from __future__ import annotations

from pydantic import Field

from adaptcheck.base.schemas.environment import Environment
from adaptcheck.base.schemas.evidence import Evidence


class CaptureEvidence(Evidence):
    """``matrix.capture``: the captured environment (also the results file's ``environment``)."""

    environment: Environment = Field(description="The compatibility matrix of this machine, secrets redacted.")


# ---------------------------------------------------------------- matrix.rules ---------
class RuleCompared(Evidence):
    """The values a rule compared; each rule type records its own (the subclasses below).

    Empty when the rule could not be evaluated (the verdict's ``error`` says why).
    """


class BackendsCompared(RuleCompared):
    """A rule about other backends than this machine's (not applicable)."""

    backends: list[str] = Field(description="The backends the rule is about.")


class CudaCompared(RuleCompared):
    """``cuda_driver_minimum``: the CUDA runtime against the driver."""

    runtime: str | None = Field(description="CUDA runtime version torch was built with; None without CUDA.")
    driver: str | None = Field(description="Driver version (device row or runtimes); None when unknown.")
    required_driver: str | None = Field(default=None, description="'>=' the major release's minimum driver.")
    release_driver: str | None = Field(default=None, description="The runtime release's own driver, when the "
                                       "installed one is below it (minor-version compatibility).")


class RequirementCompared(RuleCompared):
    """``requirement``: one distribution's declared requirement on another."""

    requirer: str | None = Field(description="'dist version' of the first installed requirer; None when none is.")
    target: str = Field(description="The distribution whose installed version is checked.")
    installed: str | None = Field(description="Its installed version; None when not installed.")
    requirement: list[str] | None = Field(default=None, description="The Requires-Dist lines on the target.")


class PluginDistribution(Evidence):
    """One vLLM plugin distribution as ``plugin_requires_vllm`` judged it."""

    distribution: str = Field(description="Distribution name.")
    version: str | None = Field(description="Installed version.")
    requires: list[str] = Field(description="Its Requires-Dist lines.")
    plugins: list[str] = Field(description="Its entry points, 'group:name'.")
    allowed: bool = Field(description="VLLM_PLUGINS lets vLLM load at least one of them.")
    requirement: list[str] | None = Field(default=None, description="Its requirement lines on vllm.")
    verdict: str | None = Field(default=None, description="The verdict for this distribution.")


class PluginsCompared(RuleCompared):
    """``plugin_requires_vllm``: every plugin distribution against the installed vLLM."""

    vllm: str | None = Field(description="'dist version' providing the vllm module; None when not installed.")
    plugins: list[PluginDistribution] = Field(description="The plugin distributions, by name.")


class ExtensionCompared(RuleCompared):
    """``extension_matches_torch``: a device extension against torch."""

    extension: str = Field(description="The extension's distribution name.")
    extension_version: str | None = Field(description="Its installed version; None when not installed.")
    torch: str | None = Field(description="Installed torch.")
    requirement: list[str] | None = Field(default=None, description="The extension's requirement lines on torch.")
    match: str | None = Field(default=None, description="The version scheme compared when it declares none.")


class DependenciesCompared(RuleCompared):
    """``dependencies_satisfied``: a targeted ``pip check``."""

    distributions: dict[str, str] = Field(description="Distribution → installed version, of those checked.")
    unmet: list[str] = Field(description="Requirements that do not hold.")
    build_label_differences: list[str] = Field(description="Warnings: another build of the same release, or a "
                                               "requirement deliberately not installed.")


class TableRowFacts(Evidence):
    """One row of a published pairing table."""

    subject: str = Field(description="Constraint on the subject.")
    object: str = Field(description="What the object must satisfy in this row.")
    source: str | None = Field(default=None, description="Row-specific source.")


class TableCompared(RuleCompared):
    """``version_table``: the subject's rows against the object."""

    subject: str = Field(description="Constraint key of the subject.")
    subject_version: str | None = Field(description="The subject's captured version.")
    object: str = Field(description="Constraint key of the object.")
    object_version: str | None = Field(description="The object's captured version.")
    wanted: list[str] | None = Field(default=None, description="What the subject's rows want of the object.")
    rows: list[TableRowFacts] | None = Field(default=None, description="The rows that hold the subject.")


class ArchCompared(RuleCompared):
    """``arch_supported``: the device architecture against torch's kernel list."""

    device_arch: str | None = Field(description="The device's architecture, e.g. sm_90 or gfx942.")
    torch: str | None = Field(description="Installed torch.")
    torch_archs: list[str] = Field(description="Archs the installed build lists (empty when not captured).")
    torch_archs_published: list[str] | None = Field(default=None, description="The published list used instead.")
    coverage: str | None = Field(default=None, description="native, ptx or none.")


ComparedRecord = (CudaCompared | RequirementCompared | PluginsCompared | ExtensionCompared | DependenciesCompared
                   | TableCompared | ArchCompared | BackendsCompared | RuleCompared)
"""What a rule's ``compared`` reads as: the rule type's own record (an empty or unknown one as
the base, its keys kept as extras)."""


class RuleEvidence(Evidence):
    """``matrix.rules.<rule id>``: one compatibility rule's verdict."""

    verdict: str | None = Field(default=None, description="ok, warn, incompatible or not_applicable (a plugin's "
                                "rule check may use another spelling, e.g. 'pass').")
    rule: str | None = Field(default=None, description="What the rule checks, in words.")
    source: str | None = Field(default=None, description="Where the rule's fact comes from.")
    compared: ComparedRecord | None = Field(default=None, description="The values the rule compared.")
    advice: list[str] | None = Field(default=None, description="When not ok: the smallest changes that make the "
                                     "rule hold, each an alternative.")


# ---------------------------------------------------------------- matrix.telemetry -----
class TelemetryEvidence(Evidence):
    """``matrix.telemetry``: what monitoring could read."""

    memory_stats: dict[str, float] = Field(description="The backend's allocator statistics, bytes.")
    telemetry: dict[str, float] = Field(description="One telemetry sample (memory, utilisation, temperature, power).")
    host: dict[str, float] = Field(description="Host figures: RSS, CPU utilisation and frequency.")
    errors: dict[str, str] = Field(description="What failed while reading (memory_stats, telemetry_sample).")


# ---------------------------------------------------------------- matrix.known_good ----
class KnownGoodEntryFacts(Evidence):
    """A known-good entry as recorded (the data file's schema, docs/compatibility.md)."""

    id: str | None = Field(default=None, description="Entry id.")
    description: str | None = Field(default=None, description="The stack in words.")
    backend: str | None = Field(default=None, description="adaptcheck backend name.")
    arch: str | None = Field(default=None, description="Machine architecture; None = any.")
    device: str | None = Field(default=None, description="Regex on the device names; None = any.")
    versions: dict[str, str] | None = Field(default=None, description="Constraint key → specifier.")
    source: str | None = Field(default=None, description="Where the claim comes from.")
    date: str | None = Field(default=None, description="When the source was read (absent in files before dates).")
    basis: str | None = Field(default=None, description="measured or published.")


class KnownGoodEvidence(Evidence):
    """``matrix.known_good``: the matching entry, or the nearest, and the way to it."""

    entry: KnownGoodEntryFacts = Field(description="The matching entry, else the nearest one.")
    entry_file: str | None = Field(default=None, description="The file the entry comes from.")
    files: list[str] | None = Field(default=None, description="Every known-good file read.")
    extra_files_env: str | None = Field(default=None, description="The variable naming a site's extra files.")
    differences: list[str] | None = Field(default=None, description="How the stack differs from the entry.")
    changes: list[str] | None = Field(default=None, description="Version changes that reach the entry.")
    advice: str | None = Field(default=None, description="One line: the nearest stack and what to change.")
    stack: dict[str, str | None] | None = Field(default=None, description="The captured value of each key the "
                                                "entry constrains.")
