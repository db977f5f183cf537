"""``framework.preemption``: a KV cache too small for the batch forces the engine to preempt
requests and resume them later, and the answers are still the unpressured run's.

The feature instance is loaded with a deliberately small KV cache (``num_gpu_blocks_override``
blocks of ``block_size`` tokens, and a ``max_model_len`` low enough that vLLM still starts: it
refuses a cache that cannot hold one request of the full length). A batch of requests submitted
together then needs more blocks than exist, so the scheduler preempts running requests (frees
their blocks) and recomputes them when blocks come back. The proof that this happened is vLLM's
own ``vllm:num_preemptions`` counter (delta > 0) and the block count read back from the engine;
the answers are held to the plain shared instance's for the same batch by the same-framework rules.
Docs: docs/features.md "Preemption"; the shared body is :mod:`adaptcheck.steps.frameworks.feature`.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from adaptcheck.base.schemas.framework_evidence import FeatureProof
from adaptcheck.frameworks.base import GenRequest
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.feature import (
    FeatureParams,
    Proof,
    engine_row,
    facts_of,
    feature_vs_plain,
    lacks_engine_args,
)
from adaptcheck.steps.frameworks.lifecycle import Active
from adaptcheck.steps.frameworks.params import LoadOverrides
from adaptcheck.steps.frameworks.probes import not_applicable

ENGINE_ARGS = frozenset({"num_gpu_blocks_override", "block_size"})
PREEMPTIONS = ("vllm:num_preemptions", "vllm:num_preemptions_total")
"""vLLM's preemption counter: its in-process name, and the Prometheus name a server exposes."""

PROMPT_TOKENS_BOUND = 40
"""Upper bound on a pressure prompt's length in tokens (the reference prompts are one sentence),
used only to judge up front whether the batch can fit the small cache."""


def cache_tokens(blocks: int, block_size: int) -> int:
    """Tokens the small KV cache holds."""
    return blocks * block_size


def batch_tokens(prompts: int, max_tokens: int, prompt_tokens: int = PROMPT_TOKENS_BOUND) -> int:
    """Tokens the whole batch needs in the cache at its end (each prompt plus its answer)."""
    return prompts * (prompt_tokens + max_tokens)


def pressure_problem(blocks: int, block_size: int, max_model_len: int, prompts: int, max_tokens: int) -> str | None:
    """Why these settings cannot force preemption (or cannot start), or None when they can.

    vLLM refuses to start when the cache cannot hold one request of ``max_model_len`` (plus the
    block it keeps back); a batch whose prompts fit the cache together never preempts."""
    if cache_tokens(blocks - 1, block_size) < max_model_len:
        return (f"kv_blocks={blocks} x block_size={block_size} cannot hold one request of "
                f"pressure_max_model_len={max_model_len} (vLLM keeps one block back): raise kv_blocks to at least "
                f"{-(-max_model_len // block_size) + 1} or lower pressure_max_model_len")
    if max_tokens + 1 > max_model_len - PROMPT_TOKENS_BOUND:
        return (f"max_tokens={max_tokens} does not fit pressure_max_model_len={max_model_len} with a prompt: "
                f"lower max_tokens below {max_model_len - PROMPT_TOKENS_BOUND}")
    need = batch_tokens(prompts, max_tokens, prompt_tokens=8)
    if need <= cache_tokens(blocks, block_size):
        return (f"{prompts} prompts x (prompt + {max_tokens} tokens) fit the {cache_tokens(blocks, block_size)}-token "
                "cache together, so nothing would be preempted: raise prompts or max_tokens, or lower kv_blocks")
    return None


class PreemptionParams(FeatureParams):
    """``framework.preemption``: how small the cache is, and the batch that overfills it."""

    together: bool = Field(default=True, description="Submit the prompts together (one batch): what makes them "
                           "compete for the cache. One at a time, nothing is preempted.")
    prompts: int = Field(default=8, ge=2, description="Requests in the batch.")
    max_tokens: int = Field(default=96, gt=0, description="Tokens per request (EOS ignored, so every request grows "
                            "to its full length and the cache really runs out).")
    kv_blocks: int = Field(default=10, ge=2, description="KV-cache blocks of the pressured instance "
                           "(vLLM's num_gpu_blocks_override).")
    block_size: int = Field(default=32, gt=0, description="Tokens per KV-cache block (vLLM's block_size; its CPU "
                            "attention takes multiples of 32).")
    pressure_max_model_len: int = Field(default=256, gt=0, description="Context length of the pressured instance: "
                                        "low enough for kv_blocks to hold one full request, which vLLM requires "
                                        "before it starts.")

    @model_validator(mode="after")
    def _can_pressure(self) -> PreemptionParams:
        why = pressure_problem(self.kv_blocks, self.block_size, self.pressure_max_model_len, self.prompts,
                               self.max_tokens)
        if why is not None:
            raise ValueError(why)
        return self


class PreemptionCheck(FrameworkCheck):
    """A batch that overfills a small KV cache: preempted and resumed requests answer as the
    unpressured run does, and vLLM's own counter shows preemptions happened."""

    kind = "framework.preemption"
    step = 4
    description = "A KV cache too small for the batch: preemptions > 0 (vLLM's counter), same answers as unpressured."
    params_model = PreemptionParams
    label = "preemption under a small KV cache"
    compares = "unpressured vs preempted"
    typical_s = 20.0

    def run(self, ctx: CheckContext, params: PreemptionParams) -> Outcome:
        cls = framework_class(params.framework)
        lacking = lacks_engine_args(cls, ENGINE_ARGS, "KV-cache size settings")
        if lacking is not None:
            return not_applicable(params, lacking)
        feature: LoadOverrides = {
            "max_model_len": params.pressure_max_model_len,
            "engine_args": {"num_gpu_blocks_override": params.kv_blocks, "block_size": params.block_size}}
        return feature_vs_plain(ctx, params, "preemption", feature,
                                lambda active: requests(params, ctx.seed),
                                lambda active, deltas: prove(active, deltas, params),
                                names=("unpressured", f"{params.kv_blocks}-block cache"))


def requests(p: PreemptionParams, seed: int) -> list[GenRequest]:
    """The batch: the run seed's reference prompts, each decoded to its full length."""
    texts = prompts.reference_prompts(p.prompts, seed)
    # Distinct prompts: repeated ones would share cached prefix blocks and ease the pressure.
    texts = [t if texts.index(t) == i else f"{t} ({i})" for i, t in enumerate(texts)]
    return [GenRequest(prompt=t, max_tokens=p.max_tokens, logprobs=p.top_n, ignore_eos=True) for t in texts]


def preemptions(deltas: dict[str, float]) -> float:
    """Preemptions counted while the pressured instance answered (either counter name)."""
    return sum(deltas.get(name, 0.0) for name in PREEMPTIONS)


def prove(active: Active, deltas: dict[str, float], p: PreemptionParams) -> Proof:
    """Preempted at least once, on the cache that was asked for (read back, not assumed)."""
    facts = facts_of(active)
    count = preemptions(deltas)
    blocks, size = facts.get("num_gpu_blocks"), facts.get("block_size")
    problems = []
    if blocks is not None and blocks != p.kv_blocks:
        problems.append(f"the engine has {blocks} blocks, not the {p.kv_blocks} asked for")
    if count <= 0:
        problems.append("no request was preempted, so resuming was never exercised")
    seen = "counter not exposed" if not any(name in deltas for name in PREEMPTIONS) and count == 0 else f"{count:.0f}"
    how = (f"{seen} preemptions (vllm:num_preemptions) over {p.prompts} requests submitted together; "
           f"engine KV cache {blocks} blocks x {size} tokens")
    if problems:
        how += ": " + "; ".join(problems)
    ok = not problems
    record = FeatureProof(feature="preemption", active=ok, how=how, engine=facts,
                          counters={k: v for k, v in deltas.items() if "preempt" in k})
    return Proof(rows=[engine_row("preemption", ok, how)], record=record,
                 metrics={"preemptions": count, "num_gpu_blocks": blocks if isinstance(blocks, int) else None})
