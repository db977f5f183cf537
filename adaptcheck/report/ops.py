"""View data of step 3 — the op × dtype matrix and the per-op evidence, plain data, no HTML —
read from each ``ops.op`` result's typed evidence; details that do not fit read as empty, so a
crashed or foreign result shows what is known (what the cells say: docs/ops.md, "Reading the
report").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from adaptcheck.base.schemas.evidence import EvidenceError
from adaptcheck.base.schemas.ops_evidence import (
    CaseEvidence,
    Figure,
    OpEvidence,
    OpMetrics,
    OutputEvidence,
    ScaledCase,
    ToleranceSpec,
)
from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, RunResults
from adaptcheck.report.fmt import (
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
from adaptcheck.report.served_ops import NOT_USED_TEXT, VLLM_PROVIDER, unused_ops

OP_KIND = "ops.op"
STEP = 3
DEFAULT_PROVIDER = "torch"
# Preferred column order: the float family from wide to narrow, then the quantized ones.
# Dtypes the report does not know yet go after these, in the order they first appear.
DTYPE_ORDER = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")
INFINITY_TEXT = "∞"


@dataclass
class OpCell:
    """One op × dtype cell of the matrix."""

    dtype: str
    checked: bool  # False: the op's check does not cover this dtype (another op's column)
    status: Label | None
    ratio: str  # measured error / tolerance, '0.24×', '∞', or '' when nothing was measured
    over: bool  # the ratio exceeds 1 (shown stronger: out of tolerance)
    message: str
    anchor: str  # the per-dtype detail block
    id: str = ""


@dataclass
class OpRow:
    """One op (of one provider, from one ladder check) across the dtype columns."""

    op: str
    provider: str
    check_id: str
    check_note: str  # the ladder check id when it is not the conventional one, else ''
    anchor: str  # the per-op detail block
    cells: list[OpCell]
    # A result that covers the whole check (worker crash, planned but never run): one
    # statement across every column instead of per-dtype cells.
    whole: OpCell | None = None
    # Set when step 4 shows the served model did not run this kernel here (served_ops): the
    # note, and the evidence behind it ('RMSNorm.forward_native, per framework.vllm.reference').
    unused: str = ""
    unused_detail: str = ""


@dataclass
class ProviderGroup:
    """Rows of one provider; ``heading`` is empty for torch, the default provider."""

    provider: str
    heading: str
    rows: list[OpRow]


@dataclass
class ToleranceRow:
    """One output of the op: the policy's limits beside the worst measured numbers."""

    output: str
    klass: str
    mode: str
    limits: str
    ratio: str
    over: bool
    max_abs: str
    max_rel: str
    cosine: str
    normalized: str
    max_ulp: str
    mismatch: str


@dataclass
class OutputRow:
    """One output of one case."""

    output: str
    mode: str
    status: Label
    ratio: str
    over: bool
    max_abs: str
    max_rel: str
    cosine: str
    normalized: str
    max_ulp: str
    mismatch: str
    worst_index: str
    worst_got: str
    worst_expected: str
    worst_abs: str
    reason: str


@dataclass
class CaseView:
    """One case in one dtype."""

    case: str
    status: Label
    ratio: str
    over: bool
    error: str
    outputs: list[OutputRow]
    scaled: bool
    scaled_from: str
    scaled_to: str
    scaled_why: str
    notes: str
    seconds: str
    worst: bool  # the case the check names as its worst


@dataclass
class Timing:
    """Where the check's time went (sums over cases)."""

    name: str
    value: str


@dataclass
class OpDtypeView:
    """Evidence of one ``ops.<op>.<dtype>`` result."""

    id: str
    check_anchor: str  # the generic check entry in the Checks section
    anchor: str
    dtype: str
    status: Label
    ratio: str
    over: bool
    message: str
    cases_total: str
    cases_failed: str
    tolerance: list[ToleranceRow]
    cases: list[CaseView]
    timings: list[Timing]


@dataclass
class OpDetail:
    """Everything recorded about one op row."""

    op: str
    provider: str
    check_id: str
    anchor: str
    signature: str
    description: str
    dtypes: list[OpDtypeView]
    whole: OpCell | None = None
    unused: str = ""
    unused_detail: str = ""


@dataclass
class OpsView:
    """Step 3 as the report shows it."""

    ran: bool
    not_run_reason: str
    not_run_status: Label | None = None
    dtypes: list[str] = field(default_factory=list)
    groups: list[ProviderGroup] = field(default_factory=list)
    details: list[OpDetail] = field(default_factory=list)
    legend: list[Label] = field(default_factory=list)


# ---------------------------------------------------------------- numbers


def format_ratio(value: Figure | None) -> str:
    """Measured error as a multiple of the tolerance: '0.24×', '1.02×', '∞'.

    Two significant digits are enough to read a margin, except that a ratio just above 1
    must never print as '1×' (which reads as 'at the limit, passing'): digits are added
    until the printed number is itself above 1.
    """
    r = as_float(value)
    if r is None:
        return ""
    if math.isnan(r):
        return "nan"
    if math.isinf(r):
        return INFINITY_TEXT
    if r == 0:
        return "0×"
    if r < 1e-3:
        return "<0.001×"
    if r >= 1e6:
        return f"{r:.1e}×"
    if r >= 100:
        return f"{r:,.0f}×"
    text = f"{r:.2g}"
    digits = 2
    while r > 1 and float(text) <= 1 and digits < 12:
        digits += 1
        text = f"{r:.{digits}g}"
    return text + "×"


def _over(value: Figure | None) -> bool:
    r = as_float(value)
    return r is not None and (math.isnan(r) or r > 1)


def _num(value: Figure | None) -> str:
    """An error magnitude (abs/rel/normalized): 4 significant digits, '—' when absent."""
    if value is None:
        return "—"
    f = as_float(value)
    return format_float(f) if f is not None else format_value(value)


def _exact(value: Figure | None) -> str:
    """A tensor element (got / expected): enough digits that two close values differ in print."""
    if value is None:
        return "—"
    f = as_float(value)
    if f is None:
        return format_value(value)
    if math.isfinite(f) and f == int(f) and abs(f) < 1e15:
        return str(int(f))
    return f"{f:.9g}"


def format_cosine(value: Figure | None) -> str:
    """Cosine similarity; values a hair below 1 as '1 − 3.1e-14' (rounding would show '1')."""
    c = as_float(value)
    if c is None:
        return "—"
    if not math.isfinite(c):
        return format_float(c)
    if c == 1.0:
        return "1"
    if 0 < 1.0 - c < 1e-6:
        return f"1 − {1.0 - c:.1e}"
    return f"{c:.7f}".rstrip("0")


def _fraction(value: Figure | None) -> str:
    """Mismatch fraction as a percentage of compared elements."""
    f = as_float(value)
    if f is None:
        return "—"
    if f == 0:
        return "0%"
    return f"{format_float(f * 100)}%"


def _ulp(value: Figure | None) -> str:
    f = as_float(value)
    return "—" if f is None else format_value(int(f)) if math.isfinite(f) else format_float(f)


def format_limits(limits: Mapping[str, float]) -> str:
    """'rtol 0.016, atol 0.001'; exact mode has no numbers (the caller says so)."""
    # Limits are round numbers chosen by people (1.6e-2, 0.9999): %g prints them as written.
    return ", ".join(f"{k} {v:g}" for k, v in limits.items())


# ---------------------------------------------------------------- identities


def _anchor(*parts: str) -> str:
    return section_anchor("ops", *parts)


def _parent_id(c: CheckResult, evidence: OpEvidence, planned: dict[str, PlannedCheck]) -> str:
    """The ladder check a result came from ('ops.gemm' for 'ops.gemm.bf16')."""
    if c.id in planned:
        return c.id
    rid = c.id
    while "." in rid:
        rid = rid.rsplit(".", 1)[0]
        if rid in planned:
            return rid
    dtype = evidence.dtype
    if dtype is not None and c.id.endswith("." + dtype):
        return c.id[: -len(dtype) - 1]
    # No plan and no details: by convention the last id segment is the dtype.
    return c.id.rsplit(".", 1)[0] if c.id.count(".") >= 2 else c.id


def _identity(cid: str, evidence: OpEvidence, parent: str) -> tuple[str, str, str | None]:
    """(op, provider, dtype) of a result; dtype None when the result covers the whole check."""
    dtype = evidence.dtype
    if dtype is None and cid != parent and cid.startswith(parent + "."):
        dtype = cid[len(parent) + 1:]
    # Ids are 'ops.<op>' or 'ops.<provider>.<op>' by ladder convention; details win when present
    # because --ops can swap the provider without changing the ids.
    stem = parent.removeprefix("ops.")
    guess_provider, _, guess_op = stem.rpartition(".")
    op = evidence.op if evidence.op is not None else guess_op
    provider = evidence.provider if evidence.provider is not None else (guess_provider or DEFAULT_PROVIDER)
    return op or stem, provider, dtype


def _conventional(parent: str, op: str, provider: str) -> bool:
    return parent in (f"ops.{op}", f"ops.{provider}.{op}")


def _dtype_rank(dtypes: list[str]) -> list[str]:
    first_seen = {d: i for i, d in reversed(list(enumerate(dtypes)))}
    return sorted(first_seen, key=lambda d: (DTYPE_ORDER.index(d) if d in DTYPE_ORDER else len(DTYPE_ORDER),
                                             first_seen[d]))


# ---------------------------------------------------------------- reading a result


@dataclass
class _Read:
    """One ``ops.op`` result with its details and metrics read typed (empty when they do not fit:
    a crashed worker's result, a hand-edited file), so every reader below shows what is known."""

    result: CheckResult
    evidence: OpEvidence
    metrics: OpMetrics


def _read(c: CheckResult) -> _Read:
    try:
        metrics = OpMetrics.parse(c.metrics, where=f"{c.id}: metrics")
    except EvidenceError:
        metrics = OpMetrics()
    return _Read(result=c, evidence=c.evidence(OpEvidence) or OpEvidence(), metrics=metrics)


def _measured_ratio(r: _Read) -> float | None:
    """The worst ratio the result measured.

    The check's own ``ratio_to_tolerance`` is ∞ when a case *raised*; shown in the cell that
    would read as a numerical mismatch, so the ratio is taken from the compared outputs
    when the details have them (cases that raised measured nothing), and an errored result
    without them shows no ratio.
    """
    ratios = [x for case in r.evidence.cases for o in case.outputs if (x := o.ratio_value) is not None]
    if ratios:
        return max(ratios, key=lambda x: math.inf if math.isnan(x) else x)
    if status_key(r.result) == "error":
        return None
    return as_float(r.metrics.ratio_to_tolerance)


# ---------------------------------------------------------------- details


def _case_label(case: CaseEvidence) -> Label:
    if case.error:
        return status_label("error")
    return status_label("pass" if case.passed else "fail")


def _changed(scaled: ScaledCase) -> tuple[str, str]:
    """Only the fields a shrink changed ('k=8192' → 'k=2048'), so the reader sees what moved."""
    if scaled.before is None or scaled.after is None:
        return (format_value(scaled.before) if scaled.before else "",
                format_value(scaled.after) if scaled.after else "")
    changes = scaled.changes()
    return (", ".join(f"{k}={format_value(before)}" for k, before, _ in changes),
            ", ".join(f"{k}={format_value(after)}" for k, _, after in changes))


def _output_row(o: OutputEvidence) -> OutputRow:
    worst = o.worst
    return OutputRow(
        output=o.output, mode=o.mode, status=status_label("pass" if o.passed else "fail"),
        ratio=format_ratio(o.ratio), over=_over(o.ratio),
        max_abs=_num(o.max_abs), max_rel=_num(o.max_rel),
        cosine=format_cosine(o.cosine), normalized=_num(o.normalized),
        max_ulp=_ulp(o.max_ulp), mismatch=_fraction(o.mismatch_fraction),
        worst_index=format_value(worst.index) if worst.index is not None else "—",
        worst_got=_exact(worst.got), worst_expected=_exact(worst.expected),
        worst_abs=_num(worst.abs_error), reason=o.reason,
    )


def _case_view(case: CaseEvidence, worst_case: str) -> CaseView:
    scaled = case.scaled
    before, after = _changed(scaled) if scaled.recorded else ("", "")
    total = case.seconds.total() if case.seconds is not None else None
    outputs = [_output_row(o) for o in case.outputs]
    raised = bool(case.error) and not outputs  # nothing measured: no ratio to show
    return CaseView(
        case=case.case, status=_case_label(case),
        ratio="" if raised else format_ratio(case.ratio), over=_over(case.ratio) and not raised,
        error=case.error, outputs=outputs,
        scaled=scaled.recorded, scaled_from=before, scaled_to=after, scaled_why=scaled.why,
        notes=", ".join(f"{k}={format_value(v)}" for k, v in case.notes.items()),
        seconds=format_duration(total) if total is not None else "—",
        worst=bool(worst_case) and case.case == worst_case,
    )


def _worst(values: Iterable[Figure | int | None], pick: Callable[[list[float]], float] = max) -> float | None:
    numbers = [f for f in (as_float(v) for v in values) if f is not None]
    return pick(numbers) if numbers else None


def _tolerance_rows(evidence: OpEvidence) -> list[ToleranceRow]:
    """Per output: the policy (class, mode, limits) and the worst of each measure over cases."""
    per_output: dict[str, list[OutputEvidence]] = defaultdict(list)
    for case in evidence.cases:
        for o in case.outputs:
            per_output[o.output].append(o)
    # Outputs measured without a policy entry (an older or foreign file) still get a row.
    specs = {**evidence.tolerance, **{n: ToleranceSpec() for n in per_output if n not in evidence.tolerance}}
    rows = []
    for name, spec in specs.items():
        measured = per_output[name]
        limits = spec.named()
        # The policy entry of exact/codes classes carries no numbers; the comparison does.
        for o in measured:
            for k, v in o.limits.named().items():
                limits.setdefault(k, v)
        mode = spec.mode or (measured[0].mode if measured else "")
        ratio = _worst(o.ratio for o in measured)
        rows.append(ToleranceRow(
            output=name, klass=spec.klass, mode=mode,
            limits=format_limits(limits) or ("identical values" if mode == "exact" else "—"),
            ratio=format_ratio(ratio) if ratio is not None else "—", over=_over(ratio),
            max_abs=_num(_worst(o.max_abs for o in measured)), max_rel=_num(_worst(o.max_rel for o in measured)),
            cosine=format_cosine(_worst((o.cosine for o in measured), min)),
            normalized=_num(_worst(o.normalized for o in measured)),
            max_ulp=_ulp(_worst(o.max_ulp for o in measured)),
            mismatch=_fraction(_worst(o.mismatch_fraction for o in measured)),
        ))
    return rows


def _dtype_view(r: _Read, dtype: str, anchor: str, check_anchor: str) -> OpDtypeView:
    c, m = r.result, r.metrics
    ratio = _measured_ratio(r)
    worst_case = r.evidence.worst_case or ""
    cases = [_case_view(x, worst_case) for x in r.evidence.cases]
    timings = [Timing(name=label, value=format_duration(f)) for label, value in
               (("device op", m.op_s), ("reference", m.reference_s), ("inputs", m.inputs_s), ("compare", m.compare_s))
               if (f := as_float(value)) is not None]
    return OpDtypeView(
        id=c.id, check_anchor=check_anchor, anchor=anchor, dtype=dtype, status=status_label(status_key(c)),
        ratio=format_ratio(ratio) if ratio is not None else "", over=_over(ratio), message=c.message,
        cases_total=format_value(m.cases if m.cases is not None else len(cases)),
        cases_failed=format_value(m.cases_failed if m.cases_failed is not None
                                  else sum(1 for x in cases if x.status.key != "pass")),
        tolerance=_tolerance_rows(r.evidence), cases=cases, timings=timings,
    )


# ---------------------------------------------------------------- the section


@dataclass
class _Row:
    """Accumulator of one row while results are read."""

    op: str
    provider: str
    parent: str
    description: str = ""
    signature: str = ""
    by_dtype: dict[str, _Read] = field(default_factory=dict)
    whole: _Read | None = None
    planned_only: PlannedCheck | None = None


def _not_run_reason(results: RunResults) -> str:
    return section_not_run_reason(results, STEP, "operator", "operator (ops.op) checks")


def _cell_from(r: _Read, dtype: str, anchor: str) -> OpCell:
    c, ratio = r.result, _measured_ratio(r)
    return OpCell(dtype=dtype, checked=True, status=status_label(status_key(c)),
                  ratio=format_ratio(ratio) if ratio is not None else "", over=_over(ratio),
                  message=c.message, anchor=anchor, id=c.id)


def build_ops(results: RunResults, anchors: dict[str, str]) -> OpsView:
    """The step-3 section: ``anchors`` are the Checks section's, so cells can link there too."""
    planned = {p.id: p for p in results.planned}
    rows: dict[str, _Row] = {}
    seen_dtypes: list[str] = []
    for c in results.checks:
        if c.step != STEP or c.kind != OP_KIND:
            continue
        read = _read(c)
        parent = _parent_id(c, read.evidence, planned)
        op, provider, dtype = _identity(c.id, read.evidence, parent)
        if parent not in rows:  # the first result of this ladder check makes its row
            p = planned.get(parent)
            rows[parent] = _Row(op=op, provider=provider, parent=parent, description=p.description if p else "")
        row = rows[parent]
        if read.evidence.signature is not None:
            row.signature = read.evidence.signature
        if dtype is None:
            row.whole = read
        else:
            row.by_dtype[dtype] = read
            seen_dtypes.append(dtype)
    ran = STEP in results.steps and STEP not in results.grade.steps_not_run
    result_ids = {c.id for c in results.checks}
    for p in results.planned:
        # A planned op check without any result (interrupted run): a row saying so, never a gap.
        if p.kind == OP_KIND and p.id not in rows and ran \
                and not any(r == p.id or r.startswith(p.id + ".") for r in result_ids):
            op, provider, _ = _identity(p.id, OpEvidence(), p.id)
            rows[p.id] = _Row(op=op, provider=provider, parent=p.id, description=p.description, planned_only=p)
    if not rows:
        # A step that ran without any op check is not 'not run': say n/a so the pill and the text agree.
        key = "na" if ran and results.complete else "notrun"
        return OpsView(ran=False, not_run_reason=_not_run_reason(results), not_run_status=status_label(key))

    dtypes = _dtype_rank(seen_dtypes)
    unused = unused_ops(results)
    by_provider: dict[str, list[OpRow]] = defaultdict(list)
    details: dict[str, list[OpDetail]] = defaultdict(list)
    used: set[str] = set()
    for parent, row in rows.items():
        base = _anchor(row.provider, row.op) if _conventional(parent, row.op, row.provider) else _anchor(parent)
        row_anchor, n = base, 2
        while row_anchor in used:  # two checks of one op and provider would otherwise share a fragment
            row_anchor, n = f"{base}-{n}", n + 1
        used.add(row_anchor)
        cells = []
        dviews = []
        for dtype in dtypes:
            cell_anchor = f"{row_anchor}-{_anchor(dtype)[4:]}"
            if dtype not in row.by_dtype:
                cells.append(OpCell(dtype=dtype, checked=False, status=None, ratio="", over=False,
                                    message="not part of this op's check", anchor=""))
                continue
            res = row.by_dtype[dtype]
            cells.append(_cell_from(res, dtype, cell_anchor))
            dviews.append(_dtype_view(res, dtype, cell_anchor, anchors.get(res.result.id, "")))
        whole = None
        if row.whole is not None:
            whole = _cell_from(row.whole, "", row_anchor)
            whole.anchor = anchors.get(row.whole.result.id, row_anchor)
        elif row.planned_only is not None:
            whole = OpCell(dtype="", checked=False, status=status_label("notrun"), ratio="", over=False,
                           message="not reached: the run ended before this check recorded a result",
                           anchor=anchors.get(parent, row_anchor), id=parent)
        note = "" if _conventional(parent, row.op, row.provider) else parent
        # Only vLLM's own kernels can be bypassed by a CustomOp's forward_native.
        why = unused.get(row.op, "") if row.provider == VLLM_PROVIDER else ""
        by_provider[row.provider].append(OpRow(op=row.op, provider=row.provider, check_id=parent, check_note=note,
                                               anchor=row_anchor, cells=cells, whole=whole,
                                               unused=NOT_USED_TEXT if why else "", unused_detail=why))
        details[row.provider].append(OpDetail(op=row.op, provider=row.provider, check_id=parent, anchor=row_anchor,
                                              signature=row.signature, description=row.description,
                                              dtypes=dviews, whole=whole,
                                              unused=NOT_USED_TEXT if why else "", unused_detail=why))
    # torch first (the default, unlabelled), then other providers by name, each in ladder order.
    order = sorted(by_provider, key=lambda p: (p != DEFAULT_PROVIDER, p))
    groups = [ProviderGroup(provider=p, heading="" if p == DEFAULT_PROVIDER else f"provider {p}",
                            rows=by_provider[p]) for p in order]
    present = {cell.status.key for g in groups for r in g.rows for cell in [*r.cells, r.whole]
               if cell is not None and cell.status is not None}
    legend = [status_label(k) for k in ("pass", "fail", "error", "skip", "na", "notrun") if k in present]
    return OpsView(ran=True, not_run_reason="", dtypes=dtypes, groups=groups,
                   details=[d for p in order for d in details[p]], legend=legend)
