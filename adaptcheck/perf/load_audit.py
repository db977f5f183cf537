"""Was the load measured the load asked for? The served output and prompt lengths of a
scenario's completed requests, from the best count there is, and the one-line problems that
fail it (``details.workload``, a
:class:`~adaptcheck.base.schemas.serving_evidence.WorkloadAudit`). Rules: docs/perf.md,
"Served lengths and endpoint evidence".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from adaptcheck.base.schemas.serving_evidence import WorkloadAudit
from adaptcheck.perf.loadgen import LoadGenerator
from adaptcheck.perf.serving_metrics import RequestRecord

ESTIMATE_TOLERANCE = 0.1
"""Relative slack for a length known only from re-encoding the text (plus ESTIMATE_SLACK tokens)."""
ESTIMATE_SLACK = 2


class _Run(Protocol):
    """The part of :class:`~adaptcheck.perf.loadgen.RunResult` audited."""

    @property
    def measured(self) -> list[RequestRecord]: ...


@dataclass
class _Tally:
    """Requests of one level with one kind of problem, and an example."""

    count: int = 0
    example: str = ""


@dataclass
class _Level:
    completed: int = 0
    kinds: dict[str, _Tally] = field(default_factory=lambda: defaultdict(_Tally))

    def add(self, kind: str, example: str) -> None:
        tally = self.kinds[kind]
        tally.count += 1
        tally.example = tally.example or example


# Problem kinds, in the order they are reported (the verdict shows the first two).
LONG, SHORT, USAGE_IDS, PROMPT = "long", "short", "usage_vs_ids", "prompt"
_WHAT = {
    LONG: "requests were served more output tokens than max_tokens",
    SHORT: "requests stopped short of the output length asked",
    USAGE_IDS: "requests have usage.completion_tokens different from the token ids streamed",
    PROMPT: "prompts were served at a length other than the one sent",
}


def output_count(rec: RequestRecord) -> tuple[int | None, str]:
    """The best count of the tokens served to ``rec`` and where it comes from: usage | token_ids |
    tokenizer (an estimate) | none."""
    if rec.usage_tokens is not None:
        return rec.usage_tokens, "usage"
    if rec.itl_basis == "token_ids":
        return sum(rec.chunk_tokens), "token_ids"
    if rec.tokenizer_tokens is not None:
        return rec.tokenizer_tokens, "tokenizer"
    return None, "none"


def _audit(rec: RequestRecord, fixed_length: bool, lv: _Level, notes: dict[str, int]) -> None:
    asked = rec.max_tokens
    if asked is None:
        return
    served, source = output_count(rec)
    chunks = len(rec.itl_s) + 1
    ids = sum(rec.chunk_tokens) if rec.itl_basis == "token_ids" else None
    if rec.usage_tokens is not None and ids is not None and rec.usage_tokens != ids:
        lv.add(USAGE_IDS, f"usage {rec.usage_tokens} vs {ids} ids")
    if source == "tokenizer" and served is not None:  # an estimate: only a clear excess or shortfall counts
        slack = ESTIMATE_SLACK + ESTIMATE_TOLERANCE * asked
        long = served > asked + slack or chunks > asked
        short = served < asked - slack
    else:
        longest = max(v for v in (served, ids, chunks) if v is not None)
        long = longest > asked
        short = served is not None and served < asked
    how = f"by {source}" if served is not None else "by content chunks"
    if long:
        shown = max(v for v in (served, ids, chunks) if v is not None)
        lv.add(LONG, f"{shown} > {asked}, {how}")
    elif short:
        finish = rec.finish_reason
        if fixed_length or finish == "length":
            lv.add(SHORT, f"{served} < {asked}, finish {finish!r}, {how}")
        else:
            notes["ended at EOS before max_tokens (ignore_eos not accepted)"] += 1
    if rec.input_tokens_sent is not None and rec.input_tokens is not None and rec.input_tokens != rec.input_tokens_sent:
        lv.add(PROMPT, f"usage.prompt_tokens {rec.input_tokens} vs {rec.input_tokens_sent} counted before sending")


def audit(by_level: Sequence[tuple[float, Sequence[_Run]]], *, ignore_eos: str, api: str, prompt_lengths: str,
          rejected_fields: Sequence[str], target_input: Callable[[int], int]) -> WorkloadAudit:
    """``details["workload"]``: the served lengths of the completed measured requests, and ``problems``.

    ``ignore_eos``: native | emulated (…) | not accepted. ``target_input(index)``: the prompt
    length the scenario asked for request ``index`` (its shape).
    """
    fixed_length = ignore_eos != "not accepted"
    notes: dict[str, int] = defaultdict(int)
    levels: list[tuple[float, _Level]] = []
    done: list[RequestRecord] = []
    for level, runs in by_level:
        lv = _Level()
        levels.append((level, lv))
        for res in runs:
            for rec in res.measured:
                if rec.ok:
                    lv.completed += 1
                    done.append(rec)
                    _audit(rec, fixed_length, lv, notes)
    problems: list[str] = []
    for kind in (LONG, SHORT, USAGE_IDS, PROMPT):
        for level, lv in levels:
            tally = lv.kinds.get(kind)
            if tally and tally.count:
                problems.append(f"level {level:g}: {tally.count}/{lv.completed} {_WHAT[kind]} "
                                f"(e.g. {tally.example}): the load measured was not the load asked")

    def count(kind: str) -> int:
        return sum(lv.kinds[kind].count for _, lv in levels if kind in lv.kinds)

    sources = {output_count(r)[1] for r in done}
    return WorkloadAudit(
        api=api,
        ignore_eos=ignore_eos,
        completed=len(done),
        output_lengths=sources.pop() if len(sources) == 1 else ("mixed" if sources else None),
        long_outputs=count(LONG),
        short_outputs=count(SHORT) + sum(notes.values()),
        usage_missing=sum(1 for r in done if r.usage_tokens is None),
        prompt_lengths=prompt_lengths,
        prompt_length_mismatches=count(PROMPT),
        input_length_off=sum(1 for r in done if r.input_tokens != target_input(r.index)),
        rejected_fields=sorted(rejected_fields),
        notes=[f"{n} request(s) {what}" for what, n in notes.items()],
        problems=problems,
    )


def workload_facts(by_level: Sequence[tuple[float, Sequence[_Run]]], gen: LoadGenerator) -> WorkloadAudit:
    """:func:`audit` of what ``gen`` drove (its route, field policy and prompt factory)."""
    rejected = gen.rejected_fields
    ignore_eos = ("emulated (generation_config min_new_tokens)" if "ignore_eos" in rejected
                  and "generation_config" not in rejected else
                  "not accepted" if "ignore_eos" in rejected else "native")
    return audit(by_level, ignore_eos=ignore_eos, api=gen.api, prompt_lengths=gen.workload.factory.lengths,
                 rejected_fields=sorted(rejected),
                 target_input=lambda index: gen.workload.shape(index).input_tokens)
