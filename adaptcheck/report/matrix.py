"""View data of step 1: the captured compatibility matrix and the rule verdicts.

An absent value is shown as 'not present' together with the capture's note on why (tool
missing, probe timed out…), because "we looked and found nothing" and "we could not look"
are different findings for whoever reads the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adaptcheck.base.schemas.environment import DeviceInfo, Environment
from adaptcheck.base.schemas.matrix_evidence import KnownGoodEvidence, RuleEvidence
from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.report.fmt import NOT_PRESENT, format_value, status_key

RULES_PREFIX = "matrix.rules."

# Rule verdicts: label of each key. A rule check may state its verdict in details['verdict'];
# otherwise it is derived from the status (a pass is 'ok', a fail 'incompatible').
VERDICT_LABELS: dict[str, str] = {
    "ok": "ok",
    "warn": "warn",
    "incompatible": "incompatible",
    "na": "not applicable",
    "error": "error",
    "unchecked": "not checked",
}
_VERDICT_ALIASES: dict[str, str] = {
    "ok": "ok", "pass": "ok", "compatible": "ok",
    "warn": "warn", "warning": "warn",
    "incompatible": "incompatible", "fail": "incompatible",
    "not applicable": "na", "not_applicable": "na", "n/a": "na", "na": "na",
    "error": "error",
}

# The verdict a rule result without a stated one reads as, by its status key (every key).
_STATUS_VERDICTS: dict[str, str] = {"pass": "ok", "fail": "incompatible", "error": "error", "skip": "unchecked",
                                    "na": "na"}


@dataclass
class FieldRow:
    """One field of the matrix: a label, its value, and why it is missing when it is."""

    label: str
    value: str
    present: bool
    note: str = ""


@dataclass
class FieldGroup:
    """A titled list of fields (host, runtimes, packages, tools…)."""

    title: str
    rows: list[FieldRow] = field(default_factory=list)


@dataclass
class DeviceRow:
    """One accelerator, its cells in the order of :data:`DEVICE_COLUMNS`."""

    cells: list[FieldRow]


@dataclass
class PluginRow:
    """One vLLM plugin entry point."""

    group: str
    name: str
    value: str
    distribution: str
    allowed: bool
    allowed_label: str


@dataclass
class RuleRow:
    """One compatibility rule's verdict."""

    id: str
    anchor: str
    verdict: str
    verdict_label: str
    message: str
    source: str


@dataclass
class KnownGoodView:
    """The ``matrix.known_good`` result: the matched (or nearest) stack, where its claim comes
    from and when, and what to change to reach it."""

    matched: bool
    entry: str
    basis: str
    date: str
    source: str
    file: str
    advice: str
    message: str


@dataclass
class MatrixView:
    """Step 1 as the report shows it."""

    captured: bool
    missing_reason: str
    groups: list[FieldGroup] = field(default_factory=list)
    device_columns: list[str] = field(default_factory=list)
    devices: list[DeviceRow] = field(default_factory=list)
    devices_note: str = ""
    plugins: list[PluginRow] = field(default_factory=list)
    plugins_filter: FieldRow | None = None
    env_vars: list[FieldRow] = field(default_factory=list)
    rules: list[RuleRow] = field(default_factory=list)
    known_good: KnownGoodView | None = None


DEVICE_COLUMNS: list[tuple[str, str]] = [
    ("index", "#"), ("name", "name"), ("vendor", "vendor"),
    ("memory_total_mib", "memory total (MiB)"), ("memory_used_mib", "memory used (MiB)"),
    ("driver_version", "driver"), ("firmware_version", "firmware"), ("bus_id", "bus id"),
    ("uuid", "uuid"), ("temperature_c", "temp (°C)"), ("power_w", "power (W)"),
    ("utilization_pct", "util (%)"),
]

_HOST_FIELDS: list[tuple[str, str]] = [
    ("hostname", "hostname"), ("os", "OS"), ("kernel", "kernel"), ("arch", "architecture"),
    ("cpu_model", "CPU model"), ("cpu_count", "CPUs"), ("memory_total_gib", "host memory (GiB)"),
]
_STACK_FIELDS: list[tuple[str, str]] = [
    ("backend", "backend"), ("driver_version", "driver"), ("firmware_version", "firmware"),
    ("python", "Python"), ("python_executable", "Python executable"), ("torch", "PyTorch"),
]


def _note(env: Environment, *keys: str) -> str:
    """The first capture note found under any of ``keys`` (most specific first)."""
    for key in keys:
        if key in env.notes:
            return env.notes[key]
    return ""


def _row(env: Environment, label: str, value: Any, *note_keys: str) -> FieldRow:
    if value is None:
        return FieldRow(label=label, value=NOT_PRESENT, present=False, note=_note(env, *note_keys))
    return FieldRow(label=label, value=format_value(value), present=True)


def _dict_group(env: Environment, title: str, attr: str, values: dict[str, str | None]) -> FieldGroup:
    rows = [_row(env, k, v, f"{attr}.{k}", k) for k, v in sorted(values.items())]
    if not rows:
        note = _note(env, attr)
        rows = [FieldRow(label="(none)", value=NOT_PRESENT, present=False, note=note)]
    return FieldGroup(title=title, rows=rows)


def _device_row(env: Environment, dev: DeviceInfo) -> DeviceRow:
    cells = []
    for attr, label in DEVICE_COLUMNS:
        value = getattr(dev, attr)
        cells.append(_row(env, label, value, f"accelerators.{dev.index}.{attr}", f"accelerators.{attr}"))
    return DeviceRow(cells=cells)


def _model_group(env: Environment) -> FieldGroup:
    m = env.model
    if m is None:
        return FieldGroup(title="Model", rows=[_row(env, "model", None, "model")])
    return FieldGroup(title="Model", rows=[
        _row(env, "name", m.name, "model.name"),
        _row(env, "revision", m.revision, "model.revision"),
        _row(env, "precision", m.precision, "model.precision"),
        _row(env, "context length", m.context_length, "model.context_length"),
        _row(env, "source", m.source, "model.source"),
    ])


def _plugins_filter(env: Environment) -> FieldRow:
    row = _row(env, "VLLM_PLUGINS", env.vllm_plugins_filter, "vllm_plugins_filter")
    if not row.present and not row.note:
        row.note = "not set: vLLM loads every installed plugin"
    return row


def build_rules(checks: list[CheckResult], anchors: dict[str, str]) -> list[RuleRow]:
    """The verdict of every expanded compatibility rule result."""
    rows = []
    for c in checks:
        if not c.id.startswith(RULES_PREFIX):
            continue
        evidence = c.evidence(RuleEvidence)
        stated = evidence.verdict if evidence is not None and evidence.verdict is not None else ""
        verdict = _VERDICT_ALIASES.get(stated.strip().lower()) or _STATUS_VERDICTS[status_key(c)]
        # A stated verdict can never read milder than the status: the status is what the grade uses.
        if c.status is Status.ERROR:
            verdict = "error"
        elif c.status is Status.FAIL and verdict not in ("incompatible", "error"):
            verdict = "incompatible"
        elif c.status is Status.SKIP and verdict == "ok":
            verdict = "na" if not c.applicable else "unchecked"
        source = evidence.source if evidence is not None else None
        rows.append(RuleRow(
            id=c.id, anchor=anchors[c.id], verdict=verdict, verdict_label=VERDICT_LABELS[verdict],
            message=c.message, source=format_value(source) if source is not None else "",
        ))
    return rows


def build_known_good(checks: list[CheckResult]) -> KnownGoodView | None:
    """The known-good result as the report shows it; None when the check did not run."""
    c = next((c for c in checks if c.kind == "matrix.known_good"), None)
    evidence = c.evidence(KnownGoodEvidence) if c is not None else None
    if c is None or evidence is None:
        return None
    entry = evidence.entry
    return KnownGoodView(
        matched=c.status is Status.PASS, entry=entry.id or "", basis=entry.basis or "",
        # Results written before entries carried a date show none rather than a made-up one.
        date=entry.date or NOT_PRESENT, source=entry.source or "",
        file=evidence.entry_file or "", advice=evidence.advice or "", message=c.message)


def build_matrix(env: Environment | None, checks: list[CheckResult], anchors: dict[str, str]) -> MatrixView:
    """The compatibility-matrix section; ``env`` is None when capture did not happen."""
    rules = build_rules(checks, anchors)
    known_good = build_known_good(checks)
    if env is None:
        capture = next((c for c in checks if c.kind == "matrix.capture"), None)
        if capture is None:
            reason = "matrix.capture did not run"
        elif capture.status is Status.PASS:
            reason = "matrix.capture passed but recorded no environment"
        else:
            reason = f"matrix.capture ended '{status_key(capture)}': {capture.message}"
        return MatrixView(captured=False, missing_reason=reason, rules=rules, known_good=known_good)
    groups = [
        FieldGroup(title="Host", rows=[_row(env, label, getattr(env, a), a) for a, label in _HOST_FIELDS]),
        FieldGroup(title="Stack", rows=[_row(env, label, getattr(env, a), a) for a, label in _STACK_FIELDS]),
        _dict_group(env, "Runtimes", "runtimes", env.runtimes),
        _dict_group(env, "Torch device extensions", "torch_device_extension", env.torch_device_extension),
        _dict_group(env, "Inference packages", "packages", env.packages),
        _dict_group(env, "Vendor tools", "tools", env.tools),
        _model_group(env),
    ]
    plugins = [
        PluginRow(group=p.group, name=p.name, value=p.value,
                  distribution=" ".join(x for x in (p.distribution, p.distribution_version) if x) or NOT_PRESENT,
                  allowed=p.allowed, allowed_label="allowed" if p.allowed else "blocked by VLLM_PLUGINS")
        for p in env.vllm_plugins
    ]
    return MatrixView(
        captured=True, missing_reason="", groups=groups,
        device_columns=[label for _, label in DEVICE_COLUMNS],
        devices=[_device_row(env, d) for d in env.accelerators],
        devices_note=_note(env, "accelerators") if not env.accelerators else "",
        plugins=plugins,
        plugins_filter=_plugins_filter(env),
        env_vars=[FieldRow(label=k, value=v, present=True) for k, v in sorted(env.env_vars.items())],
        rules=rules,
        known_good=known_good,
    )
