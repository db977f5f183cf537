"""Compare two greedy generations token by token, the way vLLM's own tests do.

Two runs on different kernels must agree up to the first divergence, and there each side's
token must be among the other's top-N (``top_n``); two runs of one framework with the same
kernels may only part at a near tie (``near_tie``); an answer without token ids is compared
as text. The rules and why: docs/step4-numerics.md ("Greedy comparison"). Everything here is
pure: generations in, verdicts out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from adaptcheck.base.schemas.framework_evidence import PromptVerdict
from adaptcheck.frameworks.base import Generation

Mode = Literal["top_n", "near_tie", "exact"]


@dataclass(frozen=True)
class TextCodec:
    """The model's tokenizer, as the text comparison needs it."""

    decode: Callable[[list[int]], str]
    encode: Callable[[str], list[int]]


@dataclass
class PairVerdict:
    """The comparison of one prompt's two generations (``a`` is the reference side)."""

    index: int
    ok: bool
    exact: bool
    common_prefix: int
    len_a: int
    len_b: int
    divergence: int | None = None
    token_a: int | None = None
    token_b: int | None = None
    b_in_top_a: bool | None = None
    a_in_top_b: bool | None = None
    gap_a: float | None = None
    """logprob_a(token_a) − logprob_a(token_b) at the divergence, when known."""
    max_logprob_diff: float | None = None
    """Largest |logprob_a − logprob_b| of the shared tokens over the common prefix."""
    reason: str = ""
    by_text: bool = False
    """Compared as text (the answer had no token ids)."""


@dataclass
class Comparison:
    """All prompts of one comparison."""

    mode: Mode
    top_n: int
    pairs: list[PairVerdict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.pairs)

    @property
    def failures(self) -> list[PairVerdict]:
        return [p for p in self.pairs if not p.ok]

    def metrics(self) -> dict[str, float | None]:
        """Agreement numbers for the report (counts, shares; None: no logprobs to compare)."""
        n = len(self.pairs)
        tokens = sum(max(p.len_a, p.len_b) for p in self.pairs)
        agreed = sum(p.common_prefix for p in self.pairs)
        diffs = [p.max_logprob_diff for p in self.pairs if p.max_logprob_diff is not None]
        return {
            "sequences": n,
            "sequences_exact": sum(p.exact for p in self.pairs),
            "sequences_diverged_within_top_n": sum((not p.exact) and p.ok for p in self.pairs),
            "sequences_failed": sum(not p.ok for p in self.pairs),
            "token_agreement": round(agreed / tokens, 4) if tokens else 1.0,
            "min_common_prefix_fraction": round(min(
                (p.common_prefix / max(p.len_a, p.len_b, 1) for p in self.pairs), default=1.0), 4),
            "max_logprob_abs_diff": round(max(diffs), 5) if diffs else None,
        }

    def verdicts(self) -> list[PromptVerdict]:
        """Each prompt's verdict as its record (every field set: one shape for every prompt)."""
        return [PromptVerdict.model_validate(asdict(p)) for p in self.pairs]

    def details(self) -> list[dict[str, Any]]:
        """``details.comparison`` (JSON): :meth:`verdicts` as the details store them."""
        return [v.dump() for v in self.verdicts()]

    def summary(self) -> str:
        m = self.metrics()
        text = (f"{m['sequences_exact']}/{m['sequences']} identical, {m['sequences_diverged_within_top_n']} diverged "
                f"within tolerance, {m['sequences_failed']} failed; token agreement {m['token_agreement']:.1%}")
        if self.failures:
            text += "; first failure: " + self.failures[0].reason
        return text


def _lp(top: list[dict[int, float]] | None, pos: int, token: int) -> float | None:
    if top is None or pos >= len(top):
        return None
    return top[pos].get(token)


def _in_top(top: list[dict[int, float]] | None, pos: int, token: int, n: int) -> bool | None:
    """Whether ``token`` is among the ``n`` most likely at ``pos``; None when logprobs are absent."""
    if top is None or pos >= len(top):
        return None
    ranked = sorted(top[pos].items(), key=lambda kv: -kv[1])[:n]
    return any(t == token for t, _ in ranked)


def compare_text(index: int, a: Generation, b: Generation, *, mode: Mode, top_n: int,
                 codec: TextCodec | None) -> PairVerdict:
    """Compare when either side has no token ids: by text, one-sided top-N at a divergence."""
    ids_a = a.token_ids or []
    v = PairVerdict(index=index, ok=True, exact=a.text == b.text, common_prefix=0, len_a=len(ids_a),
                    len_b=len(b.token_ids or []) or (len(codec.encode(b.text)) if codec else 0), by_text=True)
    if v.exact:
        v.common_prefix = max(v.len_a, v.len_b)
        return v
    at = next((i for i, (x, y) in enumerate(zip(a.text, b.text, strict=False)) if x != y), min(len(a.text), len(b.text)))
    v.ok = False
    v.reason = f"prompt {index}: the texts differ from character {at}: {a.text[at:at + 20]!r} vs {b.text[at:at + 20]!r}"
    if mode != "top_n" or codec is None or not ids_a:
        return v
    # The reference token whose text covers the first differing character.
    k = 0
    while k < len(ids_a) and len(codec.decode(ids_a[: k + 1])) <= at:
        k += 1
    v.common_prefix = v.divergence = k
    if k >= len(ids_a):
        v.reason = f"prompt {index}: the answer goes on after the reference's {len(ids_a)} tokens ended"
        return v
    start = len(codec.decode(ids_a[:k]))
    if b.text[:start] != a.text[:start] or start >= len(b.text):
        v.reason = f"prompt {index}: the answer stopped or differs before token {k} of the reference"
        return v
    tb = codec.encode(b.text[start:])[0]
    v.token_a, v.token_b = ids_a[k], tb
    v.b_in_top_a = _in_top(a.top_logprobs, k, tb, top_n)
    v.ok = bool(v.b_in_top_a)
    v.reason = "" if v.ok else f"prompt {index}: token {k} is {tb} instead of {ids_a[k]}, not in the reference's top-{top_n}"
    return v


def compare_pair(index: int, a: Generation, b: Generation, *, mode: Mode, top_n: int = 5,
                 tie_margin: float = 0.0, codec: TextCodec | None = None) -> PairVerdict:
    """Compare generation ``b`` against ``a`` (the reference, or the run alone)."""
    if a.token_ids is None or b.token_ids is None:
        return compare_text(index, a, b, mode=mode, top_n=top_n, codec=codec)
    ids_a, ids_b = a.token_ids or [], b.token_ids or []
    common = 0
    while common < min(len(ids_a), len(ids_b)) and ids_a[common] == ids_b[common]:
        common += 1
    diffs = [abs(la - lb) for pos in range(common)
             if (la := _lp(a.top_logprobs, pos, ids_a[pos])) is not None
             and (lb := _lp(b.top_logprobs, pos, ids_b[pos])) is not None]
    v = PairVerdict(index=index, ok=True, exact=False, common_prefix=common, len_a=len(ids_a), len_b=len(ids_b),
                    max_logprob_diff=max(diffs) if diffs else None)
    if common == len(ids_a) == len(ids_b):
        v.exact = True
        return v
    v.divergence = common
    if common == min(len(ids_a), len(ids_b)):
        # Same tokens, but one side stopped: EOS or max_tokens handled differently — a real defect.
        v.ok = False
        shorter = "reference" if len(ids_a) < len(ids_b) else "answer"
        v.reason = (f"prompt {index}: same first {common} tokens, then the {shorter} stopped "
                    f"(lengths {len(ids_a)} vs {len(ids_b)}, finish {a.finish_reason} vs {b.finish_reason})")
        return v
    ta, tb = ids_a[common], ids_b[common]
    v.token_a, v.token_b = ta, tb
    v.b_in_top_a = _in_top(a.top_logprobs, common, tb, top_n)
    v.a_in_top_b = _in_top(b.top_logprobs, common, ta, top_n)
    lpa, lpb = _lp(a.top_logprobs, common, ta), _lp(a.top_logprobs, common, tb)
    v.gap_a = (lpa - lpb) if lpa is not None and lpb is not None else None
    where = f"prompt {index}: token {common} is {tb} instead of {ta}"
    if mode == "exact":
        v.ok, v.reason = False, where
    elif mode == "top_n":
        # A side without logprobs cannot vouch; the side that has them must.
        known = [x for x in (v.b_in_top_a, v.a_in_top_b) if x is not None]
        v.ok = bool(known) and all(known)
        if not v.ok:
            v.reason = (where + (f", not in the other's top-{top_n}" if known else ", and no logprobs to excuse it"))
    else:  # near_tie
        v.ok = v.gap_a is not None and abs(v.gap_a) <= tie_margin
        if not v.ok:
            gap = "unknown" if v.gap_a is None else f"{v.gap_a:.4f}"
            v.reason = f"{where}; logprob gap {gap} exceeds the tie margin {tie_margin:g}"
    return v


def compare(a: list[Generation], b: list[Generation], *, mode: Mode, top_n: int = 5,
            tie_margin: float = 0.0, codec: TextCodec | None = None) -> Comparison:
    """Compare two lists of generations prompt by prompt."""
    if len(a) != len(b):
        raise ValueError(f"cannot compare {len(a)} generations with {len(b)}")
    out = Comparison(mode=mode, top_n=top_n)
    out.pairs = [compare_pair(i, x, y, mode=mode, top_n=top_n, tie_margin=tie_margin, codec=codec)
                 for i, (x, y) in enumerate(zip(a, b, strict=False))]
    return out
