"""``framework.kv_cache``: repeated rounds give the same answers and leave the KV cache and memory at baseline.

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared lifecycle is :mod:`adaptcheck.steps.frameworks.lifecycle`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import Field, JsonValue

from adaptcheck.base.procs import tree_rss_mib
from adaptcheck.base.schemas.framework_evidence import SubcheckRow
from adaptcheck.frameworks.base import Framework, Generation, GenRequest
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.agreement import Comparison, compare
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.lifecycle import Active, acquire, release, run_with_framework
from adaptcheck.steps.frameworks.params import TeacherSized
from adaptcheck.steps.frameworks.probes import (
    Tok,
    generations_distribution_row,
    local_tokenizer,
    strip_eos,
    subcheck,
    tie_margin_for,
    verdict,
)


class KvCacheParams(TeacherSized):
    """``framework.kv_cache``."""

    rounds: int = Field(default=4, ge=2, description="Rounds of the same batch after one warm-up round.")
    batch: int = Field(default=6, ge=1, description="Requests per round.")
    prefix_tokens: int = Field(default=256, ge=0, description="Shared prefix length (exercises prefix caching).")
    max_tokens: int = Field(default=16, gt=0, description="Tokens per request.")
    memory_growth_mib: float = Field(default=64.0, ge=0, description="Largest process memory growth (RSS) allowed "
                                     "after the rounds, where no KV-cache gauge is readable.")
    compare_prefix_off: bool = Field(default=False, description="Also load the framework with prefix caching off "
                                     "and compare (frameworks with prefix caching only).")
    top_n: int = Field(default=5, ge=1, le=20, description="Logprobs per position for the comparisons.")
    tie_margin: float | None = Field(default=None, ge=0, description="Tie margin in nats; default by dtype.")


class KvCacheCheck(FrameworkCheck):
    """Repeated rounds give the same answers and leave KV cache / memory at baseline; prefix cache."""

    kind = "framework.kv_cache"
    step = 4
    description = "Many requests leave the KV cache and memory at baseline; prefix-cache hits give the same tokens."
    params_model = KvCacheParams
    label = "KV cache"
    compares = "prefix-cache hit vs recompute"

    def run(self, ctx: CheckContext, params: KvCacheParams) -> Outcome:
        return run_with_framework(ctx, params, kv_cache)


def _rss_mib() -> float:
    """Resident memory of this process and its descendants (a launched server included), MiB;
    0 where unreadable (not Linux), so the growth reads as none rather than failing."""
    return tree_rss_mib(os.getpid()) or 0.0


def _kv_requests(tok: Tok, p: KvCacheParams) -> list[GenRequest]:
    prefix = tok.long_prompt(p.prefix_tokens, seed=7) if p.prefix_tokens else ""
    return [GenRequest(prompt=f"{prefix} {prompts.SHORT_PROMPTS[i % len(prompts.SHORT_PROMPTS)]}".strip(),
                       max_tokens=p.max_tokens, logprobs=p.top_n) for i in range(p.batch)]


def kv_cache(ctx: CheckContext, active: Active, p: KvCacheParams) -> Outcome:
    fw, tok = active.framework, local_tokenizer(active)
    eos = tok.eos_ids()
    margin = tie_margin_for(p.tie_margin, active.options.dtype)
    reqs = _kv_requests(tok, p)
    first = [g for g in fw.generate(reqs)]  # warm-up round: fills caches and pools
    base_state, base_rss, hits_before = fw.memory_state(), _rss_mib(), _prefix_hits(fw)
    rows: list[SubcheckRow] = []
    worst: Comparison | None = None
    for _ in range(p.rounds):
        again = [g for g in fw.generate(reqs)]
        cmp = compare([strip_eos(g, eos) for g in first], [strip_eos(g, eos) for g in again],
                      mode="near_tie", top_n=p.top_n, tie_margin=margin, codec=tok.codec())
        if worst is None or not cmp.ok:
            worst = cmp
    assert worst is not None
    rows.append(subcheck(f"{p.rounds} more rounds give the same answers (cached prefixes reused)", worst.ok, worst.summary()))
    dist_row, distribution = generations_distribution_row(ctx, active, tok, p.teacher,
                                                           "distributions: cached rounds vs the first", first, again)
    rows.append(dist_row)
    state, rss = fw.memory_state(), _rss_mib()
    metrics: dict[str, float | None] = {"rounds": p.rounds, "batch": p.batch,
                                        "rss_growth_mib": round(rss - base_rss, 1)}
    kv_keys = [k for k in state if "kv_cache_usage" in k or "cache_usage" in k]
    if kv_keys:
        k = kv_keys[0]
        metrics.update(kv_usage_before=base_state.get(k), kv_usage_after=state[k])
        busy = state.get("vllm:num_requests_running", 0.0) + state.get("vllm:num_requests_waiting", 0.0)
        ok = state[k] <= max(base_state.get(k, 0.0), 0.0) + 1e-6 and busy == 0
        rows.append(subcheck("KV cache back at baseline", ok, f"{k} {base_state.get(k)} → {state[k]}, requests in flight {busy:g}"))
    elif not fw.runs_here():
        rows.append(subcheck("memory back at baseline", None, "the server runs elsewhere and exposes no KV-cache gauge"))
    else:
        growth = rss - base_rss
        rows.append(subcheck("memory back at baseline", growth <= p.memory_growth_mib,
                         f"no KV-cache gauge readable; process RSS grew {growth:.1f} MiB over {p.rounds} rounds "
                         f"(bound {p.memory_growth_mib:g} MiB)"))
    rows.append(_prefix_hits_row(active, hits_before, _prefix_hits(fw), p.prefix_tokens))
    if p.compare_prefix_off:
        rows.append(_prefix_off_row(ctx, active, p, reqs, first, eos))
    return verdict(rows, "KV cache", metrics=metrics, details={"distribution": distribution})


def engine_turned_prefix_caching_off(fw: Framework) -> str | None:
    """Why the running engine has prefix caching off although the load did not ask for that
    (read back from its resolved config), or None. vLLM on a CPU turns it off for models with
    multi-head latent attention: the prefix-cache rows are then not applicable, with that
    reason, rather than a silent pass or a failed hit count."""
    facts = fw.engine_facts()
    if facts.get("enable_prefix_caching") is not False:
        return None
    why = (f"{fw.display_name} turned prefix caching off for this model (resolved engine config: "
           f"enable_prefix_caching=False, enable_chunked_prefill={facts.get('enable_chunked_prefill')}")
    if facts.get("use_mla"):
        why += "; vLLM disables both for multi-head latent attention (MLA) models on a non-GPU platform"
    return why + ")"


def _prefix_hits(fw: Framework) -> float | None:
    values = [v for k, v in fw.metrics().items() if "prefix_cache_hits" in k]
    return sum(values) if values else None


def _prefix_hits_row(active: Active, before: float | None, after: float | None, prefix_tokens: int) -> SubcheckRow:
    """The repeated rounds really were served from the prefix cache (else nothing was tested)."""
    fw = active.framework
    if not fw.supports_prefix_caching or active.options.enable_prefix_caching is False:
        return subcheck("prefix cache hit", None, f"prefix caching is not in use on {fw.display_name}")
    turned_off = engine_turned_prefix_caching_off(fw)
    if turned_off:
        return subcheck("prefix cache hit", None, turned_off)
    if before is None or after is None:
        return subcheck("prefix cache hit", None, "the framework exposes no prefix-cache counter")
    state = state_prefix_caching(fw.engine_facts(), prefix_tokens)
    if state is not None and state[0] is None:
        return subcheck("prefix cache hit", None, state[1])
    note = f"; {state[1]}" if state is not None else ""
    return subcheck("prefix cache hit", after > before,
                    f"prefix-cache hit tokens {before:g} → {after:g} over the rounds{note}")


def state_prefix_caching(facts: Mapping[str, JsonValue], prefix_tokens: int) -> tuple[bool | None, str] | None:
    """How the engine caches the prefix of a model with recurrent (Mamba) state, from its
    resolved config; None for a model without such state or an engine that does not say.

    vLLM keeps a hybrid model's Mamba state for a prefix only at whole state blocks
    (``mamba_cache_mode`` 'align', ``mamba_block_size`` tokens) or not at all ('none'): a
    shared prefix shorter than one block can never hit, and that is vLLM's design, not a
    fault, so the hit row is then not applicable with the reason instead of failing (and
    never passes silently: the mode is named either way).
    """
    if not facts.get("has_inner_state"):
        return None
    mode, block = facts.get("mamba_cache_mode"), facts.get("mamba_block_size")
    if mode is None:
        return None
    if mode == "none":
        return None, "vLLM does not cache the Mamba state of a prefix for this model (mamba_cache_mode 'none')"
    how = f"vLLM caches this model's Mamba state per whole block of {block} tokens (mamba_cache_mode '{mode}')"
    if mode == "align" and isinstance(block, int) and prefix_tokens < block:
        return None, f"{how}; the shared prefix of ~{prefix_tokens} tokens is shorter than one block, so it cannot hit"
    return True, how


def _prefix_off_row(ctx: CheckContext, active: Active, p: KvCacheParams, reqs: list[GenRequest],
                    cached: list[Generation], eos: set[int]) -> SubcheckRow:
    if not active.framework.supports_prefix_caching:
        return subcheck("prefix cache on vs off", None, f"{active.framework.display_name} has no prefix-caching switch")
    turned_off = engine_turned_prefix_caching_off(active.framework)
    if turned_off:  # on vs off would compare two instances without it: no second load
        return subcheck("prefix cache on vs off", None, turned_off)
    params = p.model_copy(update={"prefix_caching": False})
    # The toggle too: under a --serve deployment the ladder's params are not what loads, the deployment is.
    other = acquire(ctx, p.framework, ctx.check_id, toggles={"enable_prefix_caching": False}, **params.load_overrides())
    tok = local_tokenizer(other)
    off = [g for g in other.framework.generate(reqs)]
    cmp = compare([strip_eos(g, eos) for g in cached], [strip_eos(g, eos) for g in off], mode="top_n", top_n=p.top_n,
                  codec=tok.codec())
    release(ctx)
    return subcheck("prefix cache on vs off", cmp.ok, cmp.summary())
