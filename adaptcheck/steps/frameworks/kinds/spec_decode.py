"""``framework.spec_decode``: speculative decoding gives the plain run's answers, and really drafted.

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared feature body is :mod:`adaptcheck.steps.frameworks.feature`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue

from adaptcheck.frameworks.base import GenRequest
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.feature import FeatureParams, Proof, engine_row, facts_of, feature_vs_plain
from adaptcheck.steps.frameworks.lifecycle import Active
from adaptcheck.steps.frameworks.probes import not_applicable

DRAFTS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"


class SpecDecodeParams(FeatureParams):
    """``framework.spec_decode``: which drafter, how many tokens it proposes."""

    method: Literal["ngram"] = Field(default="ngram", description="Drafter: 'ngram' (prompt lookup).")
    num_speculative_tokens: int = Field(default=3, ge=1, le=16, description="Tokens drafted per step.")
    max_tokens: int = Field(default=64, gt=0, description="Tokens per prompt: long enough for the answers to "
                            "repeat themselves, which is what an n-gram drafter proposes from.")

    def speculative_config(self) -> dict[str, JsonValue]:
        return {"method": "ngram", "num_speculative_tokens": self.num_speculative_tokens,
                "prompt_lookup_min": 2, "prompt_lookup_max": 4}


class SpecDecodeCheck(FrameworkCheck):
    """Speculative decoding on vs off: same greedy tokens, distributions within the same-framework
    bound, and the drafter drafted and the verifier accepted (vLLM's own counters)."""

    kind = "framework.spec_decode"
    step = 4
    description = "Speculative decoding on vs off give the same answers; drafted and accepted tokens > 0."
    params_model = SpecDecodeParams
    label = "speculative decoding on vs off"
    compares = "speculative decoding off vs on"
    typical_s = 25.0

    def run(self, ctx: CheckContext, params: SpecDecodeParams) -> Outcome:
        cls = framework_class(params.framework)
        if not cls.supports_speculative_decoding:
            return not_applicable(params, f"{cls.display_name} has no speculative decoding")
        return feature_vs_plain(ctx, params, "speculative decoding",
                                {"engine_args": {"speculative_config": params.speculative_config()}},
                                lambda active: _requests(params), _prove,
                                names=("speculation off", f"{params.method} speculation"))


def _requests(p: SpecDecodeParams) -> list[GenRequest]:
    # Prompts that repeat themselves give the n-gram drafter something to look up from the start.
    texts = [f"{t} {t} {t}" for t in (prompts.SHORT_PROMPTS * 4)[: p.prompts]]
    return [GenRequest(prompt=t, max_tokens=p.max_tokens, logprobs=p.top_n) for t in texts]


def _prove(active: Active, deltas: dict[str, float]) -> Proof:
    from adaptcheck.base.schemas.framework_evidence import FeatureProof

    facts = facts_of(active)
    drafted, accepted = deltas.get(DRAFTS, 0.0), deltas.get(ACCEPTED, 0.0)
    rate = accepted / drafted if drafted else None
    ok = drafted > 0 and accepted > 0
    how = (f"{drafted:.0f} tokens drafted, {accepted:.0f} accepted"
           + (f" (acceptance {rate:.0%})" if rate is not None else "")
           + f"; engine speculative method {facts.get('speculative_method')!r}")
    if drafted == 0:
        how += ": nothing was drafted, so nothing was verified"
    elif accepted == 0:
        how += ": no draft token was ever accepted"
    record = FeatureProof(feature="spec_decode", active=ok, how=how, engine=facts,
                          counters={k: v for k, v in deltas.items() if "spec_decode" in k})
    return Proof(rows=[engine_row("speculative decoding", ok, how)], record=record,
                 metrics={"drafted_tokens": drafted, "accepted_tokens": accepted, "acceptance_rate": rate})
