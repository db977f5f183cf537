"""``framework.single_request``: one request at a time honours lengths, long input, max_tokens, stop strings and EOS.

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared lifecycle is :mod:`adaptcheck.steps.frameworks.lifecycle`.
"""

from __future__ import annotations

import itertools

from pydantic import Field

from adaptcheck.base.schemas.framework_evidence import SubcheckRow
from adaptcheck.frameworks.base import FrameworkError, Generation, GenRequest
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.lifecycle import Active, run_with_framework
from adaptcheck.steps.frameworks.params import FrameworkParams
from adaptcheck.steps.frameworks.probes import local_tokenizer, speaks_openai, subcheck, usage_row, verdict


class SingleRequestParams(FrameworkParams):
    """``framework.single_request``."""

    output_lengths: list[int] = Field(default=[1, 8, 32], min_length=1, description="max_tokens values for the short prompt.")
    long_prompt_tokens: int = Field(default=700, gt=0, description="Length of the long prompt, in tokens.")
    long_max_tokens: int = Field(default=16, gt=0, description="max_tokens for the long prompt.")


class SingleRequestCheck(FrameworkCheck):
    """One request at a time: lengths, long input, max_tokens, stop strings, EOS."""

    kind = "framework.single_request"
    step = 4
    description = "Single requests: short/long input, several output lengths, max_tokens, stop strings and EOS honoured."
    params_model = SingleRequestParams
    label = "single requests"

    def run(self, ctx: CheckContext, params: SingleRequestParams) -> Outcome:
        return run_with_framework(ctx, params, single_requests)


def single_requests(ctx: CheckContext, active: Active, p: SingleRequestParams) -> Outcome:
    fw, tok = active.framework, local_tokenizer(active)
    eos = tok.eos_ids()
    rows: list[SubcheckRow] = []
    prompt = prompts.SHORT_PROMPTS[0]
    by_len: dict[int, Generation] = {}
    for n in sorted(set(p.output_lengths)):
        g = fw.generate([GenRequest(prompt=prompt, max_tokens=n)])[0]
        by_len[n] = g
        rows.append(_length_row(f"short prompt, max_tokens={n}", g, n, eos))
    rows.append(_prefix_row(by_len))
    tiny = [fw.generate([GenRequest(prompt=t, max_tokens=4)])[0] for t in prompts.TINY_PROMPTS]
    rows.extend(_length_row(f"tiny prompt {t!r}, max_tokens=4", g, 4, eos) for t, g in zip(prompts.TINY_PROMPTS, tiny, strict=False))
    long_text = tok.long_prompt(p.long_prompt_tokens)
    g = fw.generate([GenRequest(prompt=long_text, max_tokens=p.long_max_tokens)])[0]
    row = _length_row(f"long prompt (~{p.long_prompt_tokens} tokens), max_tokens={p.long_max_tokens}", g,
                      p.long_max_tokens, eos)
    if g.prompt_tokens is not None and tok.hf is not None:
        want = len(tok.hf(long_text)["input_ids"])
        if g.prompt_tokens != want:
            row.ok = False
            row.detail += f"; usage.prompt_tokens {g.prompt_tokens} != {want} from the model's tokenizer"
    rows.append(row)
    rows.append(usage_row("usage counts", [*by_len.values(), g], eos, required=speaks_openai(fw),
                           max_tokens=[*by_len, p.long_max_tokens]))
    rows.append(_stop_row(active))
    rows.extend(_eos_rows(active))
    return verdict(rows, "single requests", metrics={"requests": len(by_len) + len(tiny) + 4})


def _length_row(name: str, g: Generation, max_tokens: int, eos: set[int]) -> SubcheckRow:
    n = len(g.token_ids) if g.token_ids is not None else g.completion_tokens
    fr = g.finish_reason
    if n is None:
        return subcheck(name, None, "the framework returns neither token ids nor usage")
    ends_eos = bool(g.token_ids) and g.token_ids[-1] in eos  # type: ignore[index]
    tokens_wo_eos = n - (1 if ends_eos else 0)
    if fr == "length":
        ok = tokens_wo_eos == max_tokens or n == max_tokens
        why = f"finish 'length' after {n} tokens"
    elif fr == "stop":
        ok = n <= max_tokens and (ends_eos or g.token_ids is None)
        why = f"finish 'stop' after {n} tokens" + ("" if ok else " without EOS or a stop string")
    else:
        ok, why = False, f"unexpected finish_reason {fr!r} after {n} tokens"
    if n > max_tokens:
        ok, why = False, f"{n} tokens returned for max_tokens={max_tokens}"
    return subcheck(name, ok, why)


def _prefix_row(by_len: dict[int, Generation]) -> SubcheckRow:
    """Greedy decoding is causal: the answer to max_tokens=8 is the start of max_tokens=32."""
    lens = sorted(by_len)
    if len(lens) < 2:
        return subcheck("shorter answers are prefixes", None, "only one output length requested")
    bad = []
    for short, long in itertools.pairwise(lens):
        a, b = by_len[short], by_len[long]
        if a.token_ids is not None and b.token_ids is not None:
            same = b.token_ids[: len(a.token_ids)] == a.token_ids
        else:
            same = b.text.startswith(a.text)
        if not same:
            bad.append(f"max_tokens={short} is not the start of max_tokens={long}")
    return subcheck("shorter answers are prefixes", not bad, "; ".join(bad) or f"lengths {lens} agree")


def _stop_row(active: Active) -> SubcheckRow:
    """A stop string cuts the answer right before it. The probe comes from the synthetic
    model's recorded output, or from this framework's own greedy answer for any model."""
    fw = active.framework
    probe = (active.model.synthetic or {}).get("stop_probe") if fw.serves_local_weights() else None
    prompt, max_tokens = (probe["prompt"], int(probe["max_tokens"])) if probe else (prompts.SHORT_PROMPTS[2], 24)
    full = fw.generate([GenRequest(prompt=prompt, max_tokens=max_tokens)])[0].text
    stop = probe["stop"] if probe else _pick_stop(full)
    if stop is None:
        return subcheck("stop string honoured", None, f"the answer {full[:40]!r} has no usable stop string")
    where = full.find(stop)
    if where < 0:
        return subcheck("stop string honoured", None, f"this framework's answer does not contain {stop!r}: "
                    "it diverged from the reference before it (see framework.reference)")
    g = fw.generate([GenRequest(prompt=prompt, max_tokens=max_tokens, stop=[stop])])[0]
    want = full[:where]
    ok = g.finish_reason == "stop" and g.text in (want, want + stop)
    if not ok:
        detail = f"stop {stop!r}: expected {want!r} with finish 'stop', got {g.text!r} with finish {g.finish_reason!r}"
    elif g.text == want:
        detail = f"stop {stop!r}: answer cut to {len(g.text)} chars, finish 'stop'"
    else:
        # Generation did stop there; only the returned text differs from OpenAI's rule.
        detail = (f"stop {stop!r}: stopped at the stop string, but the text includes it "
                  "(OpenAI-compatible servers leave it out)")
    return subcheck("stop string honoured", ok, detail, includes_stop_string=ok and g.text != want)


def _pick_stop(text: str) -> str | None:
    """A word from the second half of ``text`` whose first occurrence is there."""
    words = [w for w in text.split() if len(w) >= 3 and w.isascii() and w.isprintable()]
    for w in words[len(words) // 2:]:
        at = text.find(w)
        if at >= len(text) // 3:
            return w
    return None


def _eos_rows(active: Active) -> list[SubcheckRow]:
    fw = active.framework
    meta = active.model.synthetic if fw.serves_local_weights() else None
    if not meta or "eos_step" not in meta:
        return [subcheck("EOS honoured", None, "no prompt is known to end in EOS for this model (synthetic models have one)")]
    prompt, k = meta["eos_probe_prompt"], int(meta["eos_step"])
    g = fw.generate([GenRequest(prompt=prompt, max_tokens=k + 8)])[0]
    n = len(g.token_ids) if g.token_ids is not None else g.completion_tokens
    ok = g.finish_reason == "stop" and n in (k, k + 1)
    rows = [subcheck("EOS honoured", ok, f"reference ends with EOS after {k} tokens; framework: finish "
                 f"{g.finish_reason!r} after {n} tokens")]
    try:
        g2 = fw.generate([GenRequest(prompt=prompt, max_tokens=k + 8, ignore_eos=True)])[0]
    except FrameworkError as exc:
        rows.append(subcheck("ignore_eos honoured", None, f"not supported: {exc}"))
        return rows
    if g2.extra.get("ignore_eos_unsupported"):
        rows.append(subcheck("ignore_eos honoured", None, "the server does not accept ignore_eos"))
    else:
        n2 = len(g2.token_ids) if g2.token_ids is not None else g2.completion_tokens
        rows.append(subcheck("ignore_eos honoured", g2.finish_reason == "length" and n2 == k + 8,
                         f"finish {g2.finish_reason!r} after {n2} tokens (max_tokens {k + 8})"))
    return rows
