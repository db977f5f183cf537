"""View data of step 3: the op × dtype matrix and the per-op evidence — plain data, no HTML.

Every ``ops.op`` result is one (op, provider, dtype) cell. The cell says its status in text
and glyph (never colour alone) and the measured error as a fraction of the tolerance, so a
reader sees at a glance both *whether* an op passed and *how close* it came to the limit:
``0.9×`` passes but is worth a look on the next driver, ``∞`` is an exact-mode mismatch or
a non-finite surprise. Each op then gets a detail block with the tolerance policy of every
output beside what was measured, and every case with its worst element.

Results are read defensively: a check that crashed its worker has no details and no dtype,
a provider that is missing gives details-less skips, and an older results file may lack a
field. None of those may break the page; they show as what is known.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, RunResults
from adaptcheck.report.fmt import (
    Label,
    as_dict,
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


def format_ratio(value: Any) -> str:
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


def _over(value: Any) -> bool:
    r = as_float(value)
    return r is not None and (math.isnan(r) or r > 1)


def _num(value: Any) -> str:
    """An error magnitude (abs/rel/normalized): 4 significant digits, '—' when absent."""
    if value is None:
        return "—"
    f = as_float(value)
    return format_float(f) if f is not None else format_value(value)


def _exact(value: Any) -> str:
    """A tensor element (got / expected): enough digits that two close values differ in print."""
    if value is None:
        return "—"
    f = as_float(value)
    if f is None:
        return format_value(value)
    if math.isfinite(f) and f == int(f) and abs(f) < 1e15:
        return str(int(f))
    return f"{f:.9g}"


def format_cosine(value: Any) -> str:
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


def _fraction(value: Any) -> str:
    """Mismatch fraction as a percentage of compared elements."""
    f = as_float(value)
    if f is None:
        return "—"
    if f == 0:
        return "0%"
    return f"{format_float(f * 100)}%"


def _ulp(value: Any) -> str:
    f = as_float(value)
    return "—" if f is None else format_value(int(f)) if math.isfinite(f) else format_float(f)


def _limit(value: Any) -> str:
    # Limits are round numbers chosen by people (1.6e-2, 0.9999): %g prints them as written.
    f = as_float(value)
    return f"{f:g}" if f is not None else format_value(value)


def format_limits(limits: dict[str, Any]) -> str:
    """'rtol 0.016, atol 0.001'; exact mode has no numbers, so it says so."""
    parts = [f"{k} {_limit(v)}" for k, v in limits.items() if k not in ("class", "mode") and v is not None]
    return ", ".join(parts)


# ---------------------------------------------------------------- identities


def _anchor(*parts: str) -> str:
    return section_anchor("ops", *parts)


def _parent_id(c: CheckResult, planned: dict[str, PlannedCheck]) -> str:
    """The ladder check a result came from ('ops.gemm' for 'ops.gemm.bf16')."""
    if c.id in planned:
        return c.id
    rid = c.id
    while "." in rid:
        rid = rid.rsplit(".", 1)[0]
        if rid in planned:
            return rid
    dtype = c.details.get("dtype")
    if isinstance(dtype, str) and c.id.endswith("." + dtype):
        return c.id[: -len(dtype) - 1]
    # No plan and no details: by convention the last id segment is the dtype.
    return c.id.rsplit(".", 1)[0] if c.id.count(".") >= 2 else c.id


def _identity(cid: str, d: dict[str, Any], parent: str) -> tuple[str, str, str | None]:
    """(op, provider, dtype) of a result; dtype None when the result covers the whole check."""
    dtype: str | None = d.get("dtype") if isinstance(d.get("dtype"), str) else None
    if dtype is None and cid != parent and cid.startswith(parent + "."):
        dtype = cid[len(parent) + 1:]
    # Ids are 'ops.<op>' or 'ops.<provider>.<op>' by ladder convention; details win when present
    # because --ops can swap the provider without changing the ids.
    stem = parent.removeprefix("ops.")
    guess_provider, _, guess_op = stem.rpartition(".")
    op = d["op"] if isinstance(d.get("op"), str) else guess_op
    provider = d["provider"] if isinstance(d.get("provider"), str) else (guess_provider or DEFAULT_PROVIDER)
    return str(op or stem), str(provider), dtype


def _conventional(parent: str, op: str, provider: str) -> bool:
    return parent in (f"ops.{op}", f"ops.{provider}.{op}")


def _dtype_rank(dtypes: list[str]) -> list[str]:
    first_seen = {d: i for i, d in reversed(list(enumerate(dtypes)))}
    known = {d: i for i, d in enumerate(DTYPE_ORDER)}
    return sorted(first_seen, key=lambda d: (known.get(d, len(known)), first_seen[d]))


# ---------------------------------------------------------------- measured ratio


def _case_ratios(details: dict[str, Any]) -> list[float]:
    """Ratios of every compared output (cases that raised measured nothing)."""
    out: list[float] = []
    for case in details.get("cases") or []:
        if not isinstance(case, dict):
            continue
        for o in case.get("outputs") or []:
            r = as_float(o.get("ratio")) if isinstance(o, dict) else None
            if r is not None:
                out.append(r)
    return out


def _measured_ratio(c: CheckResult) -> float | None:
    """The worst ratio the result measured.

    The check's own ``ratio_to_tolerance`` is ∞ when a case *raised*; shown in the cell that
    would read as a numerical mismatch, so the ratio is taken from the compared outputs
    when the details have them, and an errored result without them shows no ratio.
    """
    ratios = _case_ratios(c.details)
    if ratios:
        return max(ratios, key=lambda r: math.inf if math.isnan(r) else r)
    if status_key(c) == "error":
        return None
    return as_float(c.metrics.get("ratio_to_tolerance"))


# ---------------------------------------------------------------- details


def _case_label(case: dict[str, Any]) -> Label:
    if case.get("error"):
        return status_label("error")
    return status_label("pass" if case.get("passed") else "fail")


def _changed(before: Any, after: Any) -> tuple[str, str]:
    """Only the fields a shrink changed ('k=8192' → 'k=2048'), so the reader sees what moved."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return format_value(before) if before else "", format_value(after) if after else ""
    keys = [k for k in before if k != "name" and before.get(k) != after.get(k)]
    keys += [k for k in after if k not in before and k != "name"]
    return (", ".join(f"{k}={format_value(before.get(k))}" for k in keys),
            ", ".join(f"{k}={format_value(after.get(k))}" for k in keys))


def _output_row(o: dict[str, Any]) -> OutputRow:
    worst = as_dict(o.get("worst"))
    index = worst.get("index")
    return OutputRow(
        output=str(o.get("output", "")), mode=str(o.get("mode", "")),
        status=status_label("pass" if o.get("passed") else "fail"),
        ratio=format_ratio(o.get("ratio")), over=_over(o.get("ratio")),
        max_abs=_num(o.get("max_abs")), max_rel=_num(o.get("max_rel")),
        cosine=format_cosine(o.get("cosine")), normalized=_num(o.get("normalized")),
        max_ulp=_ulp(o.get("max_ulp")), mismatch=_fraction(o.get("mismatch_fraction")),
        worst_index=format_value(index) if index is not None else "—",
        worst_got=_exact(worst.get("got")), worst_expected=_exact(worst.get("expected")),
        worst_abs=_num(worst.get("abs_error")), reason=str(o.get("reason") or ""),
    )


def _case_view(case: dict[str, Any], worst_case: str) -> CaseView:
    scaled = as_dict(case.get("scaled"))
    before, after = _changed(scaled.get("from"), scaled.get("to")) if scaled else ("", "")
    notes = as_dict(case.get("notes"))
    seconds = as_dict(case.get("seconds"))
    total = sum((v for v in (as_float(x) for x in seconds.values()) if v is not None), 0.0)
    outputs = [_output_row(o) for o in case.get("outputs") or [] if isinstance(o, dict)]
    return CaseView(
        case=str(case.get("case", "")), status=_case_label(case),
        ratio="" if case.get("error") and not outputs else format_ratio(case.get("ratio")),
        over=_over(case.get("ratio")) and not (case.get("error") and not outputs),
        error=str(case.get("error") or ""), outputs=outputs,
        scaled=bool(scaled), scaled_from=before, scaled_to=after, scaled_why=str(scaled.get("why", "")),
        notes=", ".join(f"{k}={format_value(v)}" for k, v in notes.items()),
        seconds=format_duration(total) if seconds else "—",
        worst=bool(worst_case) and case.get("case") == worst_case,
    )


def _tolerance_rows(details: dict[str, Any]) -> list[ToleranceRow]:
    """Per output: the policy (class, mode, limits) and the worst of each measure over cases."""
    policy = as_dict(details.get("tolerance"))
    per_output: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for case in details.get("cases") or []:
        for o in (case.get("outputs") or []) if isinstance(case, dict) else []:
            if isinstance(o, dict):
                per_output[str(o.get("output", ""))].append(o)
    names = list(policy) + [n for n in per_output if n not in policy]
    rows = []
    for name in names:
        spec = as_dict(policy.get(name))
        measured = per_output.get(name, [])
        limits = {k: v for k, v in spec.items() if k not in ("class", "mode")}
        # The policy entry of exact/codes classes carries no numbers; the comparison does.
        for o in measured:
            for k, v in as_dict(o.get("limits")).items():
                limits.setdefault(k, v)
        mode = str(spec.get("mode") or (measured[0].get("mode") if measured else ""))

        def worst(key: str, pick: Any = max, m: list[dict[str, Any]] = measured) -> float | None:
            vals = [f for f in (as_float(o.get(key)) for o in m) if f is not None]
            return pick(vals) if vals else None

        ratio = worst("ratio")
        rows.append(ToleranceRow(
            output=name, klass=str(spec.get("class", "")), mode=mode,
            limits=format_limits(limits) or ("identical values" if mode == "exact" else "—"),
            ratio=format_ratio(ratio) if ratio is not None else "—", over=_over(ratio),
            max_abs=_num(worst("max_abs")), max_rel=_num(worst("max_rel")),
            cosine=format_cosine(worst("cosine", min)), normalized=_num(worst("normalized")),
            max_ulp=_ulp(worst("max_ulp")), mismatch=_fraction(worst("mismatch_fraction")),
        ))
    return rows


_TIMINGS = (("device op", "op_s"), ("reference", "reference_s"), ("inputs", "inputs_s"), ("compare", "compare_s"))


def _dtype_view(c: CheckResult, dtype: str, anchor: str, check_anchor: str) -> OpDtypeView:
    d = c.details
    ratio = _measured_ratio(c)
    worst_case = str(d.get("worst_case") or "")
    cases = [_case_view(x, worst_case) for x in d.get("cases") or [] if isinstance(x, dict)]
    timings = [Timing(name=label, value=format_duration(f)) for label, key in _TIMINGS
               if (f := as_float(c.metrics.get(key))) is not None]
    return OpDtypeView(
        id=c.id, check_anchor=check_anchor, anchor=anchor, dtype=dtype, status=status_label(status_key(c)),
        ratio=format_ratio(ratio) if ratio is not None else "", over=_over(ratio), message=c.message,
        cases_total=format_value(c.metrics.get("cases", len(cases))),
        cases_failed=format_value(c.metrics.get("cases_failed", sum(1 for x in cases if x.status.key != "pass"))),
        tolerance=_tolerance_rows(d), cases=cases, timings=timings,
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
    by_dtype: dict[str, CheckResult] = field(default_factory=dict)
    whole: CheckResult | None = None
    planned_only: PlannedCheck | None = None


def _not_run_reason(results: RunResults) -> str:
    return section_not_run_reason(results, STEP, "operator", "operator (ops.op) checks")


def _cell_from(c: CheckResult, dtype: str, anchor: str) -> OpCell:
    ratio = _measured_ratio(c)
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
        parent = _parent_id(c, planned)
        op, provider, dtype = _identity(c.id, c.details, parent)
        row = rows.get(parent)
        if row is None:
            p = planned.get(parent)
            row = rows[parent] = _Row(op=op, provider=provider, parent=parent, description=p.description if p else "")
        if isinstance(c.details.get("signature"), str):
            row.signature = c.details["signature"]
        if dtype is None:
            row.whole = c
        else:
            row.by_dtype[dtype] = c
            seen_dtypes.append(dtype)
    ran = STEP in results.steps and STEP not in results.grade.steps_not_run
    result_ids = {c.id for c in results.checks}
    for p in results.planned:
        # A planned op check without any result (interrupted run): a row saying so, never a gap.
        if p.kind == OP_KIND and p.id not in rows and ran \
                and not any(r == p.id or r.startswith(p.id + ".") for r in result_ids):
            op, provider, _ = _identity(p.id, {}, p.id)
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
            res = row.by_dtype.get(dtype)
            cell_anchor = f"{row_anchor}-{_anchor(dtype)[4:]}"
            if res is None:
                cells.append(OpCell(dtype=dtype, checked=False, status=None, ratio="", over=False,
                                    message="not part of this op's check", anchor=""))
                continue
            cells.append(_cell_from(res, dtype, cell_anchor))
            dviews.append(_dtype_view(res, dtype, cell_anchor, anchors.get(res.id, "")))
        whole = None
        if row.whole is not None:
            whole = _cell_from(row.whole, "", row_anchor)
            whole.anchor = anchors.get(row.whole.id, row_anchor)
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
