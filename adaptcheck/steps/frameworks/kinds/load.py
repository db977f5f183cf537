"""``framework.load``: the framework loads the model on the device, after a header-only weights audit,
and its KV cache holds one sequence of the ``max_model_len`` it promises.

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared lifecycle is :mod:`adaptcheck.steps.frameworks.lifecycle`.

The KV-cache row (docs/features.md, "KV-cache capacity") lives here because every ladder loads the
deployed model through this check first: the capacity is a fact of the load, it costs no request,
and a deployment whose cache cannot hold ``max_model_len`` tokens fails here with the figures
instead of failing a long request in production (the source article's "long context OOM"). The
capacity is what the engine reports: vLLM's resolved cache config in process, the server's log and
``/metrics`` (``vllm:cache_config_info``) when served, and vLLM's own refusal when it would not start.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import JsonValue

from adaptcheck.base.errors import AdaptcheckError
from adaptcheck.base.schemas.framework_evidence import SubcheckRow
from adaptcheck.base.schemas.results import Status
from adaptcheck.frameworks.base import FrameworkError, GenRequest
from adaptcheck.frameworks.endpoint_fw import kv_cache_log_facts, read_server_log
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.frameworks.weights_audit import ROW_WEIGHTS
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.lifecycle import (
    Active,
    acquire,
    deployed_here,
    framework_dir,
    not_loaded,
    run_with_framework,
    with_evidence,
)
from adaptcheck.steps.frameworks.params import FrameworkParams
from adaptcheck.steps.frameworks.probes import local_tokenizer, subcheck

ROW_KV = "KV cache holds max_model_len"
KV_FACTS = ("num_gpu_blocks", "block_size", "kv_cache_size_tokens", "kv_cache_max_concurrency")
"""The engine facts the capacity is read from (``engine_facts()`` in process, the server's log served)."""
CACHE_INFO = "vllm:cache_config_info"
"""vLLM's /metrics gauge whose labels are the resolved cache config (block_size, num_gpu_blocks …)."""
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class LoadParams(FrameworkParams):
    """``framework.load``: nothing beyond the framework."""


class FrameworkLoadCheck(FrameworkCheck):
    """The framework loads the model on the device (and how long model and load took).

    A local model folder is audited first (``weights_audit``): weights that do not cover
    config.json (MISSING, UNEXPECTED or MISMATCHED tensors) or a tokenizer with ids past the
    embedding fail this check naming them, and the folder is never loaded. A vLLM engine's KV
    cache must hold one sequence of its ``max_model_len`` (the deployment's under ``--serve``).
    """

    kind = "framework.load"
    step = 4
    description = ("The framework loads the model on the device (after a header-only audit: the weights cover "
                   "config.json, the tokenizer fits the embedding); its KV cache holds one max_model_len "
                   "sequence; load time and platform facts.")
    params_model = LoadParams
    label = "load"
    typical_s = 15.0

    def run(self, ctx: CheckContext, params: LoadParams) -> Outcome:
        try:
            # Loaded here first (run_with_framework then reuses the instance), so that a load vLLM
            # refused for want of KV cache is read from its whole exception, not one error line.
            acquire(ctx, params.framework, ctx.check_id, **params.load_overrides())
        except FrameworkError as exc:
            refused = kv_refusal_outcome(ctx, params, exc)
            if refused is not None:
                return refused
        except (AdaptcheckError, OSError, ValueError):
            pass  # run_with_framework meets the same failure and reports it as it always has
        return run_with_framework(ctx, params, _load_and_audit, refusal_fails=True)


def _load_and_audit(ctx: CheckContext, active: Active, params: LoadParams) -> Outcome:
    """The load's outcome, with the weights audit's rows (which held: a refused folder never loads)
    and, for an engine with a block KV cache, the capacity row."""
    outcome = load_outcome(ctx, active)
    audit = active.audit
    if audit is None:
        rows = [{"name": ROW_WEIGHTS, "ok": None,
                 "detail": "not audited: the framework serves an endpoint's weights, not a local folder"}]
    else:
        rows = list(audit.rows)
        outcome.details["weights_audit"] = audit.describe()
        outcome.metrics["weights_audit_s"] = round(audit.seconds, 4)
        not_run = [r["detail"] for r in rows if r["ok"] is None]
        held = sum(1 for r in rows if r["ok"])
        outcome.message += f"; weights audit: {held}/{len(rows)} held" + (f" ({not_run[0]})" if not_run else "")
    kv = capacity_row(ctx, active, params)
    if kv is not None:
        row, metrics, facts = kv
        rows = [*rows, row.dump()]
        outcome.metrics.update(metrics)
        outcome.details["kv_cache"] = facts
        if row.ok is False and outcome.status != Status.FAIL:
            outcome = Outcome.failed(f"{row.name}: {row.detail}", metrics=outcome.metrics, details=outcome.details)
    outcome.details["subchecks"] = [*outcome.details.get("subchecks", []), *rows]
    return outcome


def load_outcome(ctx: CheckContext, active: Active) -> Outcome:
    reused = active.loaded_by != ctx.check_id
    metrics = {"load_s": round(active.load_s, 3)}
    if active.model.generated_s is not None:
        metrics["model_generation_s"] = round(active.model.generated_s, 3)
    tok = local_tokenizer(active)
    gen = active.framework.generate([GenRequest(prompt=prompts.SHORT_PROMPTS[0], max_tokens=4)])[0]
    if not gen.text and not gen.token_ids:
        return Outcome.failed("the model loaded but its first request returned nothing", metrics=metrics)
    what = "reused" if reused else "loaded"
    eos_note = "" if tok.hf is not None else " (endpoint of unknown weights: no local tokenizer)"
    return Outcome.passed(f"{active.framework.display_name} {what} {active.model.name} in {active.load_s:.1f} s; "
                          f"first answer {gen.text[:40]!r}{eos_note}", metrics=metrics)


# ---------------------------------------------------------------------------- KV capacity --

@dataclass(frozen=True)
class KvCapacity:
    """What an engine reports about its KV cache; each figure None where it was not read back."""

    num_blocks: int | None = None
    block_size: int | None = None
    size_tokens: int | None = None
    """vLLM's group-aware token capacity ("KV cache size: N tokens")."""
    max_concurrency: float | None = None
    """vLLM's "Maximum concurrency for L tokens per request": how many sequences of
    ``engine_max_model_len`` tokens the cache holds at once."""
    engine_max_model_len: int | None = None
    refused: bool = False
    """vLLM refused to start: its cache cannot hold one request of max_model_len."""
    refused_estimate: int | None = None
    """With a refusal: vLLM's estimate of the longest request its cache does hold."""

    @classmethod
    def from_facts(cls, facts: Mapping[str, JsonValue]) -> KvCapacity:
        """From ``engine_facts()`` or :func:`~adaptcheck.frameworks.endpoint_fw.kv_cache_log_facts`."""
        refusal = facts.get("kv_cache_refusal")
        estimate = refusal.get("estimated_max_model_len") if isinstance(refusal, dict) else None
        conc = facts.get("kv_cache_max_concurrency")
        return cls(num_blocks=as_int(facts.get("num_gpu_blocks")), block_size=as_int(facts.get("block_size")),
                   size_tokens=as_int(facts.get("kv_cache_size_tokens")),
                   max_concurrency=float(conc) if isinstance(conc, (int, float)) and not isinstance(conc, bool) else None,
                   engine_max_model_len=as_int(facts.get("max_model_len")), refused=isinstance(refusal, dict),
                   refused_estimate=as_int(estimate))


def as_int(value: object) -> int | None:
    """An integer fact (a /metrics label is a string; a bool is not a count)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def judge_kv_capacity(cap: KvCapacity, promised: int, who: str) -> tuple[bool | None, str, dict[str, float | None]]:
    """Whether the cache holds one sequence of ``promised`` tokens; the row's detail; the figures.

    ``who`` names the promise ("the deployment promises", "the instance is loaded with"). The rule,
    first that applies:

    * vLLM refused to start for want of cache: failed, with vLLM's estimate of what the cache holds;
    * the engine resolved a shorter ``max_model_len`` than promised: failed;
    * vLLM reports its group-aware concurrency (sequences of max_model_len the cache holds; it knows
      a hybrid or sliding-window model's per-group needs, which tokens × blocks do not): at least 1;
    * blocks and block size: ``ceil(promised / block_size)`` blocks besides vLLM's null block (the one
      block the block pool holds back and never hands to a request);
    * a token capacity alone: at least ``promised`` tokens.

    Nothing read back is None ("not read back"), never a pass.
    """
    blocks = (f"{cap.num_blocks:,} blocks × {cap.block_size}" if cap.num_blocks and cap.block_size else
              f"{cap.num_blocks:,} blocks" if cap.num_blocks else "")
    promise = f"{who} max_model_len {promised:,}"
    metrics: dict[str, float | None] = {"kv_cache_blocks": cap.num_blocks, "kv_block_size": cap.block_size,
                                        "kv_max_concurrency": cap.max_concurrency, "max_model_len": promised}
    if cap.refused:
        metrics["kv_cache_tokens"] = cap.refused_estimate
        if cap.refused_estimate is None:
            return False, (f"vLLM refused to start: its KV cache{f' ({blocks})' if blocks else ''} cannot hold one "
                           f"request of {promise}"), metrics
        shown = f" ({blocks}, one of them vLLM's null block)" if blocks else ""
        return False, f"KV cache holds {cap.refused_estimate:,} tokens{shown}; {promise}: vLLM refused to start", metrics
    tokens = cap.size_tokens if cap.size_tokens is not None else (
        cap.num_blocks * cap.block_size if cap.num_blocks is not None and cap.block_size else None)
    metrics["kv_cache_tokens"] = tokens
    shown = (f"KV cache holds {tokens:,} tokens" if tokens is not None else "KV cache") + (f" ({blocks})" if blocks else "")
    if tokens is None and cap.max_concurrency is None:
        return None, "not read back: the engine reports neither its KV-cache blocks nor its capacity", metrics
    if cap.engine_max_model_len is not None and cap.engine_max_model_len < promised:
        return False, f"the engine resolved max_model_len {cap.engine_max_model_len:,}; {promise} ({shown})", metrics
    if cap.max_concurrency is not None:
        fits = cap.max_concurrency >= 1.0
        why = f"{cap.max_concurrency:,.2f} sequences of that length by vLLM's count"
    elif cap.num_blocks is not None and cap.block_size:
        need = -(-promised // cap.block_size) + 1  # + vLLM's null block
        fits = cap.num_blocks >= need
        why = f"one sequence needs {need:,} blocks, vLLM's null block included"
    else:
        assert tokens is not None
        fits = tokens >= promised
        why = f"{tokens / promised:,.2f} sequences of that length"
    return fits, f"{shown}; {promise} ({why})", metrics


def promise_of(ctx: CheckContext, active: Active, params: FrameworkParams) -> tuple[int, str]:
    """The context length the instance promises (the length it was loaded with: the deployment's
    under ``--serve``, see :func:`~adaptcheck.steps.frameworks.lifecycle.acquire`), and whose promise."""
    deployed = deployed_here(ctx, framework_class(params.framework), params.model)
    return active.options.max_model_len, "the deployment promises" if deployed else "the instance is loaded with"


def engine_kv_facts(active: Active) -> dict[str, JsonValue]:
    """The KV-cache facts the engine reports: its resolved config in process; served, the server's
    log and ``/metrics``' ``vllm:cache_config_info`` labels (the log alone has no block size)."""
    facts: dict[str, JsonValue] = {k: v for k, v in active.framework.engine_facts().items()
                                   if k in (*KV_FACTS, "max_model_len") and v is not None}
    if any(k in facts for k in KV_FACTS):
        facts["source"] = "engine config"
        return facts
    facts = {}
    log = active.framework.describe().get("server_log")
    if isinstance(log, str):
        try:
            facts = kv_cache_log_facts(read_server_log(Path(log)))
        except OSError:
            facts = {}
        if facts:
            facts["source"] = "server log"
    client = getattr(active.framework, "client", None)
    try:
        samples = client.metrics() if client is not None and callable(getattr(client, "metrics", None)) else None
    except (AdaptcheckError, FrameworkError, OSError):
        samples = None
    for key in samples or {}:
        if key.split("{", 1)[0] == CACHE_INFO:
            labels = dict(_LABEL.findall(key))
            for name in KV_FACTS:
                value = labels.get(name)
                if name not in facts and value not in (None, "None"):
                    facts[name] = float(value) if name == "kv_cache_max_concurrency" else as_int(value)
            source = facts.get("source")
            facts["source"] = f"{source} + /metrics {CACHE_INFO}" if source else f"/metrics {CACHE_INFO}"
            break
    return facts


def capacity_row(ctx: CheckContext, active: Active, params: FrameworkParams
                 ) -> tuple[SubcheckRow, dict[str, float | None], dict[str, JsonValue]] | None:
    """The capacity row of a loaded vLLM engine (in process or a server adaptcheck started); None for
    any other framework: transformers has no block cache, and a user's ``--endpoint`` was started
    with a context length adaptcheck did not choose, so it promises nothing here."""
    if framework_class(active.name).deploys != "vllm":
        return None
    facts = engine_kv_facts(active)
    promised, who = promise_of(ctx, active, params)
    ok, detail, metrics = judge_kv_capacity(KvCapacity.from_facts(facts), promised, who)
    return subcheck(ROW_KV, ok, detail), metrics, facts


def kv_refusal_outcome(ctx: CheckContext, params: LoadParams, exc: BaseException) -> Outcome | None:
    """A load vLLM refused because its KV cache cannot hold one request of max_model_len: this
    check's failure with the figures (the other checks stay errors with the load's line). None for
    any other load failure."""
    texts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(texts) < 8:  # the FrameworkError, then vLLM's own exception
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    facts = kv_cache_log_facts("\n".join(texts))
    cls = framework_class(params.framework)
    if getattr(cls, "launches_server", None) == "vllm" and ("exited with code" in texts[0] or "not ready" in texts[0]):
        # A server that died starting: its refusal and its block override are in its log (the
        # error carries one line of it); the newest log of the run folder is the one just started.
        log = newest_server_log(ctx)
        facts = {**(kv_cache_log_facts(log) if log is not None else {}), **facts}
    refusal = facts.get("kv_cache_refusal")
    if not isinstance(refusal, dict):
        return None
    dep = ctx.deployment
    deployed = dep is not None and deployed_here(ctx, cls, params.model)
    args = dict(dep.engine_args) if dep is not None and deployed else dict(params.engine_args)
    # The block count and size as asked, where the engine did not log them (vLLM's default block
    # size is the platform's, not known here).
    for fact, arg in (("num_gpu_blocks", "num_gpu_blocks_override"), ("block_size", "block_size")):
        if facts.get(fact) is None and as_int(args.get(arg)) is not None:
            facts[fact] = as_int(args.get(arg))
    cap = KvCapacity.from_facts(facts)
    if cap.block_size is None and cap.num_blocks and cap.num_blocks > 1 and cap.refused_estimate \
            and cap.refused_estimate % (cap.num_blocks - 1) == 0:
        # vLLM's estimate is (blocks - its null block) × block size for a full-attention model.
        cap = dataclasses.replace(cap, block_size=cap.refused_estimate // (cap.num_blocks - 1))
    promised = as_int(refusal.get("max_model_len")) or ctx.model.context_length
    ok, detail, metrics = judge_kv_capacity(cap, promised, "the deployment promises" if deployed
                                            else "the instance is loaded with")
    row = subcheck(ROW_KV, ok, detail)
    facts["source"] = "vLLM's refusal to start"
    return with_evidence(Outcome.failed(f"{row.name}: {detail}", metrics=metrics,
                                        details={"subchecks": [row.dump()], "kv_cache": facts}),
                         not_loaded(params.framework))


def newest_server_log(ctx: CheckContext) -> str | None:
    """The newest vLLM server log of the run folder's framework/ (a served engine's refusal is there)."""
    logs = sorted(framework_dir(ctx).glob("vllm-serve-*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return None
    try:
        return read_server_log(logs[-1])
    except OSError:
        return None
