"""View data of step 4 (framework bring-up): one block per framework — plain data, no HTML.

One block per framework (its facts, the model, a row per check with its key numbers in words,
sub-check rows and divergent prompts), vLLM's platform resolution, the exact-collectives table
and each comparing check's model numerics (:mod:`adaptcheck.report.numerics`); what the page
shows and why: docs/step4-numerics.md. Every result is read as its kind's typed evidence
(:mod:`adaptcheck.base.schemas.framework_evidence`): details that do not fit (a hand-edited
file) put the check under "unknown" or leave out the part that does not fit, never break the
page. A sub-check that could not run here (``ok: null``) reads as *not run*, never as a pass.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import JsonValue

from adaptcheck.base.schemas.evidence import Evidence, EvidenceError
from adaptcheck.base.schemas.framework_evidence import (
    AdapterFacts,
    CollectivesEvidence,
    CollectivesMetrics,
    ComparingEvidence,
    FrameworkCheckEvidence,
    FrameworkInfo,
    FrameworkMetrics,
    FrameworkRef,
    ModelInfo,
    PromptVerdict,
    lifecycle_evidence_model,
)
from adaptcheck.base.schemas.framework_evidence import CollectiveRow as CollectiveRecord
from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, RunResults
from adaptcheck.report.fmt import (
    STATUS_LABELS,
    Label,
    as_float,
    format_duration,
    format_float,
    format_value,
    section_anchor,
    section_not_run_reason,
    status_key,
    status_label,
)
from adaptcheck.report.mode import check_mode
from adaptcheck.report.numerics import CheckNumerics, check_numerics

STEP = 4
COLLECTIVES_KIND = "framework.collectives"
UNKNOWN_FRAMEWORK = "unknown"
# Comparisons are short lists (a few prompts); a cap keeps a hand-made ladder of hundreds readable.
MAX_DIVERGENCES = 20

# Facts of ``details.framework`` shown in the block, in this order, with these labels. Keys a
# plugin adds go after them under their own names, so nothing it reports is hidden.
FACT_LABELS: dict[str, str] = {
    "vllm": "vLLM version",
    "transformers": "transformers version",
    "platform": "platform",
    "device_type": "device type",
    "vllm_target_device": "VLLM_TARGET_DEVICE",
    "device": "device",
    "dtype": "dtype",
    "attention": "attention",
    "enforce_eager": "enforce_eager",
    "enable_prefix_caching": "prefix caching",
    "tensor_parallel_size": "tensor parallel size",
    "url": "URL",
    "served_model": "served model",
    "server_command": "server command",
    "server_log": "server log",
    "server_startup_s": "server startup",
    "server_pid": "server pid",
}
# Shown elsewhere in the block (heading, load line, platform table, capabilities).
_FACTS_SHOWN_ELSEWHERE = {"name", "loaded", "display_name", "load_s", "loaded_by", "framework", "platform_plugins",
                          "general_plugins", "capabilities"}
# Printed in monospace: paths, commands, identifiers a reader copies.
_MONO_FACTS = {"platform", "url", "served_model", "server_command", "server_log", "vllm", "transformers"}

# Collective row statuses (collectives.merge_rows) as the report shows them; an unknown
# one must never read as a pass, so it falls back to 'not run' with its own word.
_COLLECTIVE_STATUS: dict[str, Label] = {
    "ok": Label(key="pass", label="ok", glyph="✓"),
    "mismatch": Label(key="fail", label="mismatch", glyph="✗"),
    "raised": Label(key="error", label="raised", glyph="!"),
    "incomplete": Label(key="error", label="incomplete", glyph="!"),
    "unsupported": Label(key="na", label="unsupported", glyph="○"),
}


@dataclass
class Link:
    """A check id and the anchor of its entry in the Checks section ('' when it has none)."""

    id: str
    anchor: str


@dataclass
class Fact:
    """One labelled fact; ``mono`` for values a reader copies (paths, commands, ids)."""

    label: str
    value: str
    mono: bool = False


@dataclass
class SubcheckRow:
    """One ``details.subchecks`` row: held (✓ pass), did not hold (✗ fail) or not run here."""

    name: str
    status: Label
    detail: str


@dataclass
class Divergence:
    """One prompt whose two answers were not identical, and why it was (not) tolerated."""

    prompt: str
    status: Label
    text: str


@dataclass
class FwCheckRow:
    """One step-4 check of a framework."""

    id: str
    anchor: str  # the check's entry in the Checks section
    kind: str
    what: str  # the kind in words
    status: Label
    message: str
    duration: str
    summary: list[str]  # the key numbers in words, one line each
    subchecks: list[SubcheckRow]
    divergences: list[Divergence]
    divergences_more: int  # divergent prompts beyond MAX_DIVERGENCES
    instance: str  # set when the check ran on another instance than the block's (other load options)
    # Model numerics (numerics.py): teacher-forced figures, chart, localisation, distribution, reproducer.
    numerics: CheckNumerics | None = None
    # 'eager' or 'compiled' where the evidence records which the verdict holds for (report.mode); '' otherwise.
    mode: str = ""


@dataclass
class StatusCount:
    status: Label
    count: int


@dataclass
class PluginRow:
    """One vLLM platform plugin: what its detector said, and whether vLLM chose it."""

    name: str
    source: str
    outcome: Label
    detail: str
    detail_mono: bool  # a class name or an exception (copied), not a sentence
    chosen: bool


@dataclass
class PlatformView:
    """How vLLM resolved its platform on this machine."""

    platform: str
    device_type: str
    plugins: list[PluginRow]
    general_plugins: list[Fact]
    note: str  # e.g. no answer names the platform vLLM chose


@dataclass
class FrameworkBlock:
    """Everything the report says about one framework."""

    name: str
    display_name: str
    anchor: str
    loaded: bool  # some check recorded facts of a loaded instance
    load_time: str
    loaded_by: Link | None
    facts: list[Fact]
    model: list[Fact]
    capabilities: list[Fact]
    platform: PlatformView | None
    counts: list[StatusCount]
    checks: list[FwCheckRow]


@dataclass
class CollectiveRow:
    op: str
    dtype: str
    elements: str
    bytes_per_rank: str
    status: Label
    time: str
    problem: str


@dataclass
class CollectivesView:
    """One ``framework.collectives`` check with its op × dtype × size table."""

    id: str
    anchor: str
    status: Label
    message: str
    summary: str
    rows: list[CollectiveRow]
    notes: list[str]


@dataclass
class FrameworkView:
    """Step 4 as the report shows it."""

    ran: bool
    not_run_reason: str
    not_run_status: Label | None = None
    frameworks: list[FrameworkBlock] = field(default_factory=list)
    collectives: list[CollectivesView] = field(default_factory=list)
    legend: list[Label] = field(default_factory=list)
    # Fragment ids of the details page's per-module localisation tables (numerics_details.html.j2).
    localised: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- small readers

M = TypeVar("M", bound=Evidence)


def _read(model: type[M], data: Mapping[str, object]) -> M | None:
    """``data`` (a check's metrics, an adapter's facts) as ``model``; None when it does not fit."""
    try:
        return model.parse(data)
    except EvidenceError:
        return None


def _link_anchor(anchors: dict[str, str], check_id: str) -> str:
    """The Checks section's anchor of a check ('' when it has no entry there)."""
    return anchors.get(check_id, "")


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _seconds(value: object) -> str:
    f = as_float(value)
    return format_duration(f) if f is not None and math.isfinite(f) and f >= 0 else format_value(value)


def _text(value: object) -> str:
    """A fact as text; None is a setting left to the framework's default."""
    if value is None:
        return "not set"
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return ", ".join(value) or "none"
    return format_value(value)


def _anchor(*parts: str) -> str:
    return section_anchor("fw", *parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# ---------------------------------------------------------------- grouping


def framework_of(result: CheckResult) -> str:
    """The framework a step-4 result belongs to: its evidence's ``framework.name``.

    Every lifecycle outcome names it (a crashed check too: the runner writes the kind's
    identity), and older files are upgraded on load; a result whose details do not say it (a
    hand-made file) is "unknown" rather than guessed from its id.
    """
    ref = result.evidence(FrameworkRef)
    return ref.framework.name if ref is not None else UNKNOWN_FRAMEWORK


def planned_framework_of(planned: PlannedCheck) -> str:
    """The framework of a planned check that never recorded a result.

    There is no evidence of a check that never ran, and the planned list does not carry its
    params: the ladder convention ``<prefix>.<framework>.<kind>`` is all there is to place it
    in a block (two segments, 'framework.batch', name no framework).
    """
    parts = planned.id.split(".")
    return parts[1] if len(parts) >= 3 and parts[1] else UNKNOWN_FRAMEWORK


# ---------------------------------------------------------------- per check


def _subchecks(evidence: FrameworkCheckEvidence | None) -> list[SubcheckRow]:
    rows = []
    for r in evidence.subchecks if evidence is not None else []:
        # Only a literal true held; null (could not run here) is 'not run'.
        key = "pass" if r.ok is True else "fail" if r.ok is False else "notrun"
        detail = r.detail
        extra = r.extras
        if extra:
            detail += (" " if detail else "") + "(" + ", ".join(f"{k}={format_value(v)}" for k, v in extra.items()) + ")"
        rows.append(SubcheckRow(name=r.name or "(unnamed)", status=status_label(key), detail=detail))
    return rows


def _divergence_text(p: PromptVerdict, top_n: int | None) -> str:
    """Where two answers of one prompt part, and why that was (not) within tolerance."""
    top = f"top-{top_n}" if top_n is not None else "top-N"
    if p.divergence is not None:
        text = f"same first {p.common_prefix} tokens, then token {p.token_a} vs {p.token_b}"
        excuses = []
        if p.b_in_top_a is True and p.a_in_top_b is True:
            excuses.append(f"each in the other's {top}")
        elif p.b_in_top_a is True:
            excuses.append(f"in the first answer's {top}")
        elif p.b_in_top_a is False or p.a_in_top_b is False:
            excuses.append(f"not in the other's {top}")
        if p.gap_a is not None:
            excuses.append(f"logprob gap {p.gap_a:.4f}")
        if excuses:
            text += " (" + ", ".join(excuses) + ")"
    else:
        text = f"same first {p.common_prefix} tokens, then one side stopped"
    text += f"; lengths {p.len_a} vs {p.len_b}"
    if p.by_text:
        text += "; compared as text"
    return f"{p.reason} — {text}" if p.reason else text


def _divergences(comparison: list[PromptVerdict], top_n: int | None) -> tuple[list[Divergence], int]:
    pairs = [p for p in comparison if p.exact is not True]
    out = []
    for p in pairs[:MAX_DIVERGENCES]:
        key = "pass" if p.ok is True else "fail" if p.ok is False else "notrun"
        out.append(Divergence(prompt=format_value(p.index) if p.index is not None else "?", status=status_label(key),
                              text=_divergence_text(p, top_n)))
    return out, max(0, len(pairs) - MAX_DIVERGENCES)


def _agreement(m: FrameworkMetrics) -> list[str]:
    """The comparison numbers (agreement.Comparison.metrics) in words."""
    n = m.sequences
    if n is None:
        return []
    # What a tolerated divergence means depends on the comparison mode the check used.
    within = (f"within top-{m.top_n}" if m.top_n is not None
              else f"within the tie margin {format_float(m.tie_margin)}" if m.tie_margin is not None
              else "within tolerance")
    line = (f"{_plural(n, 'prompt')}: {format_value(m.sequences_exact)} identical, "
            f"{format_value(m.sequences_diverged_within_top_n)} diverged {within}, "
            f"{format_value(m.sequences_failed)} failed; token agreement {_percent(m.token_agreement)}")
    extra = []
    if m.min_common_prefix_fraction is not None:
        extra.append(f"shortest common prefix {_percent(m.min_common_prefix_fraction)}")
    if m.max_logprob_abs_diff is not None:
        extra.append(f"max |Δ logprob| {format_value(m.max_logprob_abs_diff)}")
    if m.reference_dtype is not None:
        extra.append(f"reference {format_value(m.reference_dtype)} on CPU")
    if m.batch is not None:
        extra.append(f"batch of {format_value(m.batch)}")
    return [line] + (["; ".join(extra)] if extra else [])


def _summary(c: CheckResult, m: FrameworkMetrics | None) -> list[str]:
    """The key numbers of one check in words; empty when it measured nothing."""
    if m is None:
        return []
    lines: list[str] = []
    if m.load_s is not None:
        text = f"loaded in {_seconds(m.load_s)}"
        if m.model_generation_s is not None:
            text += f"; model generated in {_seconds(m.model_generation_s)}"
        lines.append(text)
    if m.requests is not None:
        lines.append(f"{format_value(m.requests)} requests")
    lines += _agreement(m)
    if m.rounds is not None:
        text = f"{format_value(m.rounds)} rounds of {format_value(m.batch)} requests"
        if {"kv_usage_before", "kv_usage_after"} & m.model_fields_set:
            text += (f"; KV-cache usage {format_value(m.kv_usage_before)} → "
                     f"{format_value(m.kv_usage_after)}")
        if m.rss_growth_mib is not None:
            text += f"; resident memory grew {format_value(m.rss_growth_mib)} MiB"
        lines.append(text)
    # compile / tensor-parallel record each variant's load time as 'load_s[<variant>]'.
    loads = [f"{k[len('load_s['):-1]} {_seconds(v)}" for k, v in c.metrics.items()
             if k.startswith("load_s[") and k.endswith("]")]
    if loads:
        lines.append("load time: " + ", ".join(loads))
    return lines


def _instance_note(fw: FrameworkInfo | None, block_loaded_by: str | None) -> str:
    """Set when the check ran on another loaded instance than the block's (other load options)."""
    if fw is None or not fw.loaded or block_loaded_by is None:
        return ""
    if fw.loaded_by and fw.loaded_by != block_loaded_by:
        return f"own instance: loaded by {fw.loaded_by} in {_seconds(fw.load_s)}"
    return ""


def _check_row(c: CheckResult, anchors: dict[str, str], loaded_by: str | None, records_base: str = "") -> FwCheckRow:
    evidence = c.evidence(lifecycle_evidence_model(c.kind))
    # The shared part still gives the rows of a check whose own records do not fit its kind.
    shared = evidence or c.evidence(FrameworkCheckEvidence)
    ref = c.evidence(FrameworkRef)
    metrics = _read(FrameworkMetrics, c.metrics)
    comparison = evidence.comparison if isinstance(evidence, ComparingEvidence) else None
    divergences, more = _divergences(comparison or [], metrics.top_n if metrics is not None else None)
    return FwCheckRow(
        id=c.id, anchor=_link_anchor(anchors, c.id), kind=c.kind, what=c.kind_label or c.kind,
        status=status_label(status_key(c)), message=c.message, duration=format_duration(c.duration_s),
        summary=_summary(c, metrics), subchecks=_subchecks(shared), divergences=divergences, divergences_more=more,
        instance=_instance_note(ref.framework if ref is not None else None, loaded_by),
        numerics=check_numerics(c.id, c.compares, evidence, records_base), mode=check_mode(c) or "",
    )


def _not_run_row(p: PlannedCheck, anchors: dict[str, str]) -> FwCheckRow:
    return FwCheckRow(id=p.id, anchor=_link_anchor(anchors, p.id), kind=p.kind, what=p.kind_label or p.kind,
                      status=status_label("notrun"),
                      message="not reached: the run ended before this check recorded a result",
                      duration="—", summary=[], subchecks=[], divergences=[], divergences_more=0, instance="")


# ---------------------------------------------------------------- per framework


def _facts(fw: Mapping[str, JsonValue], adapter: AdapterFacts | None) -> list[Fact]:
    # A vLLM block shows platform and device type with its platform table.
    with_table = adapter is not None and adapter.platform_plugins is not None
    out = []
    for key, label in FACT_LABELS.items():
        if key not in fw or (key in ("platform", "device_type") and with_table):
            continue
        text = _seconds(fw[key]) if key.endswith("_s") else _text(fw[key])
        out.append(Fact(label=label, value=text, mono=key in _MONO_FACTS))
    for key, value in fw.items():
        if key not in FACT_LABELS and key not in _FACTS_SHOWN_ELSEWHERE:
            out.append(Fact(label=str(key), value=_text(value)))
    return out


def _model_facts(model: ModelInfo | None) -> list[Fact]:
    if model is None:
        return []
    out = [Fact("model", _text(model.name), mono=True)]
    if model.architecture is not None or model.model_type is not None:
        kind = f" ({model.model_type})" if model.model_type else ""
        out.append(Fact("architecture", f"{_text(model.architecture)}{kind}"))
    shape = [text.format(format_value(v)) for v, text in
             ((model.num_layers, "{} layers"), (model.head_dim, "head_dim {}"), (model.vocab_size, "vocab {}"))
             if v is not None]
    if shape:
        out.append(Fact("shape", ", ".join(shape)))
    if model.torch_dtype is not None:
        out.append(Fact("weights dtype", _text(model.torch_dtype)))
    if model.source is not None or model.path is not None:
        out.append(Fact("source", f"{_text(model.source)}: {_text(model.path)}", mono=True))
    if model.weights_bytes is not None:
        out.append(Fact("weights size", f"{format_float(model.weights_bytes / 2**20)} MiB"))
    if model.weights_sha256:
        out.append(Fact("weights sha256", _text(model.weights_sha256), mono=True))
    syn = model.synthetic
    if syn is not None and syn.model_fields_set | set(syn.extras):
        text = f"{_text(syn.name)}, seed {_text(syn.seed)}, generator v{_text(syn.generator_version)}"
        if syn.num_params is not None:
            text += f", {format_value(syn.num_params)} parameters"
        out.append(Fact("synthetic", text))
    if model.generated_s is not None:
        out.append(Fact("generated in", _seconds(model.generated_s)))
    return out


def _capabilities(adapter: AdapterFacts | None) -> list[Fact]:
    if adapter is None or adapter.capabilities is None:
        return []
    out = []
    for key, value in adapter.capabilities.items():
        if key == "probe_error":
            out.append(Fact("probe", f"failed: {_text(value)}"))
        elif isinstance(value, bool):
            out.append(Fact(key, "yes" if value else "no"))
        else:
            out.append(Fact(key, _text(value) if value is not None else "—"))
    return out


def _platform(adapter: AdapterFacts | None) -> PlatformView | None:
    """vLLM's platform resolution: every detector's answer or failure, and the one it chose."""
    if adapter is None or adapter.platform_plugins is None:
        return None
    chosen_platform = adapter.platform
    rows = []
    for r in adapter.platform_plugins:
        chosen = False
        if r.skipped:
            outcome, detail = Label("na", "skipped", "○"), r.skipped
        elif r.load_error:
            outcome, detail = Label("error", "failed to load", "!"), r.load_error
        elif r.detect_error:
            outcome, detail = Label("error", "detector raised", "!"), r.detect_error
        elif r.answer is not None:
            chosen = chosen_platform is not None and r.answer == chosen_platform
            # Two detectors answering is legal (a vendor plugin beats a built-in); only one is used.
            outcome = Label("pass", "answered, chosen", "✓") if chosen else Label("skip", "answered, not chosen", "–")
            detail = r.answer
        elif "answer" in r.model_fields_set:
            outcome, detail = Label("na", "declined", "○"), "returned None: not this platform"
        else:
            outcome, detail = Label("notrun", "not asked", "·"), ""
        rows.append(PluginRow(name=r.name, source=r.source, outcome=outcome,
                              detail=detail, detail_mono=outcome.key in ("pass", "skip", "error"), chosen=chosen))
    general = [Fact(g.name, g.source, mono=True) for g in adapter.general_plugins or []]
    note = ""
    if chosen_platform is not None and rows and not any(r.chosen for r in rows):
        note = "no detector's answer names the platform vLLM chose"
    return PlatformView(platform=_text(chosen_platform), device_type=_text(adapter.device_type),
                        plugins=rows, general_plugins=general, note=note)


@dataclass
class _Group:
    """Accumulator of one framework while results are read."""

    name: str
    framework: FrameworkInfo | None = None  # the first loaded instance's
    model: ModelInfo | None = None
    results: list[CheckResult] = field(default_factory=list)
    planned: list[PlannedCheck] = field(default_factory=list)


def _block(g: _Group, anchor: str, anchors: dict[str, str], records_base: str = "") -> FrameworkBlock:
    info = g.framework
    # The adapter's describe() facts (versions, platform, URL…): the evidence's extra fields.
    fw = info.extras if info is not None else {}
    adapter = _read(AdapterFacts, fw)
    loaded_by = info.loaded_by if info is not None else None
    checks = [_check_row(c, anchors, loaded_by, records_base) for c in g.results]
    checks += [_not_run_row(p, anchors) for p in g.planned]
    counts = Counter(r.status.key for r in checks)
    return FrameworkBlock(
        name=g.name, display_name=info.display_name if info and info.display_name else g.name, anchor=anchor,
        loaded=info is not None,
        load_time=_seconds(info.load_s) if info is not None and info.load_s is not None else "",
        loaded_by=Link(id=loaded_by, anchor=_link_anchor(anchors, loaded_by)) if loaded_by else None,
        facts=_facts(fw, adapter), model=_model_facts(g.model), capabilities=_capabilities(adapter),
        platform=_platform(adapter),
        counts=[StatusCount(status=status_label(k), count=counts[k]) for k in STATUS_LABELS if counts[k]],
        checks=checks,
    )


# ---------------------------------------------------------------- collectives


def _collective_problem(row: CollectiveRecord) -> str:
    parts = []
    for rank, info in row.ranks.items():
        if info.mismatches:
            parts.append(f"rank {rank}: {format_value(info.mismatches)} wrong, first at [{info.first_index}]"
                         f" = {format_value(info.got)} (expected {format_value(info.expected)})")
        elif info.error:
            parts.append(f"rank {rank}: {info.error}")
    if row.missing_ranks:
        parts.append("no report from rank " + ", ".join(str(r) for r in row.missing_ranks))
    return "; ".join(parts)


def _collectives(c: CheckResult, anchors: dict[str, str]) -> CollectivesView:
    d = c.evidence(CollectivesEvidence) or CollectivesEvidence()
    m = _read(CollectivesMetrics, c.metrics) or CollectivesMetrics()
    rows = []
    for r in d.table:
        label = _COLLECTIVE_STATUS.get(r.status, Label(key="notrun", label=r.status or "unknown", glyph="·"))
        size = r.bytes_per_rank
        rows.append(CollectiveRow(
            op=r.op, dtype=r.dtype, elements=format_value(r.elements),
            bytes_per_rank=f"{format_float(size / 2**10)} KiB" if size is not None else "—", status=label,
            time=_seconds(r.time_s) if r.time_s is not None else "—", problem=_collective_problem(r),
        ))
    summary = ""
    if m.world_size is not None:
        summary = f"{format_value(m.world_size)} ranks over {format_value(m.library)}"
        if rows:
            by = Counter(r.status.label for r in rows)
            summary += f"; {_plural(len(rows), 'op run')}: " + ", ".join(f"{n} {w}" for w, n in by.items())
        if m.wall_s is not None:
            summary += f"; wall time {_seconds(m.wall_s)}"
    notes = [f"dtype {k} not checked: {v}" for k, v in d.skipped_dtypes.items()]
    for rk in d.ranks:
        ended = rk.exit or ""
        if rk.killed or (ended and ended != "exited with code 0"):
            text = f"rank {rk.rank} {ended}" + (f" ({rk.killed})" if rk.killed else "")
            if rk.stuck_at:
                text += f", stuck at {rk.stuck_at}"
            elif rk.last_line:
                text += f"; last line: {rk.last_line}"
            notes.append(text)
    return CollectivesView(id=c.id, anchor=_link_anchor(anchors, c.id), status=status_label(status_key(c)),
                           message=c.message, summary=summary, rows=rows, notes=notes)


# ---------------------------------------------------------------- the section


def _not_run_reason(results: RunResults) -> str:
    return section_not_run_reason(results, STEP, "framework", "framework checks")


def build_framework(results: RunResults, anchors: dict[str, str], records_base: str = "") -> FrameworkView:
    """The step-4 section: ``anchors`` are the Checks section's, so rows link to each check's entry;
    ``records_base`` is the run folder relative to the report's (for the reproducers' links)."""
    groups: dict[str, _Group] = {}
    collectives: list[CollectivesView] = []
    for c in results.checks:
        if c.step != STEP:
            continue
        if c.kind == COLLECTIVES_KIND:
            collectives.append(_collectives(c, anchors))
            continue
        name = framework_of(c)
        g = groups.setdefault(name, _Group(name=name))
        g.results.append(c)
        # The first loaded instance's facts describe the block (normally the load check's).
        evidence = c.evidence(lifecycle_evidence_model(c.kind)) or c.evidence(FrameworkCheckEvidence)
        if evidence is not None:
            if g.framework is None and evidence.framework.loaded:
                g.framework = evidence.framework
            if g.model is None and evidence.model is not None:
                g.model = evidence.model
    ran = STEP in results.steps and STEP not in results.grade.steps_not_run
    result_ids = {c.id for c in results.checks}
    planned_collectives: list[PlannedCheck] = []
    for p in results.planned:
        # A planned check without any result (interrupted run) is listed as not run, never a gap.
        if p.step != STEP or not ran or any(r == p.id or r.startswith(p.id + ".") for r in result_ids):
            continue
        if p.kind == COLLECTIVES_KIND:
            planned_collectives.append(p)
        else:
            name = planned_framework_of(p)
            groups.setdefault(name, _Group(name=name)).planned.append(p)
    for p in planned_collectives:
        collectives.append(CollectivesView(id=p.id, anchor=_link_anchor(anchors, p.id), status=status_label("notrun"),
                                           message="not reached: the run ended before this check recorded a result",
                                           summary="", rows=[], notes=[]))
    if not groups and not collectives:
        # A step that ran without any framework check is not 'not run': n/a, so pill and text agree.
        key = "na" if ran and results.complete else "notrun"
        return FrameworkView(ran=False, not_run_reason=_not_run_reason(results), not_run_status=status_label(key))

    blocks = []
    used: set[str] = set()
    for name, g in groups.items():
        base = _anchor(name)
        anchor, n = base, 2
        while anchor in used:  # 'vllm serve' and 'vllm-serve' would otherwise share a fragment
            anchor, n = f"{base}-{n}", n + 1
        used.add(anchor)
        blocks.append(_block(g, anchor, anchors, records_base))
    present = {r.status.key for b in blocks for r in b.checks} | {c.status.key for c in collectives}
    legend = [status_label(k) for k in STATUS_LABELS if k in present]
    localised = [r.numerics.teacher_forced.localisation_anchor for b in blocks for r in b.checks
                 if r.numerics and r.numerics.teacher_forced and r.numerics.teacher_forced.localisation_anchor]
    return FrameworkView(ran=True, not_run_reason="", frameworks=blocks, collectives=collectives, legend=legend,
                         localised=localised)
