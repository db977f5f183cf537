"""Step-4 check kinds: a real framework serves the model correctly, alone, batched and cached.

Every kind takes ``framework:`` (transformers, vllm, vllm_serve, transformers_serve,
endpoint, or a plugin) and shares the loaded instance with the checks after it (see
``session``). A framework that is not installed, or an endpoint that was not given, is a
``skip`` marked not applicable, with the reason; a model or server that fails is an
``error`` with a one-line message, and the run goes on. Each outcome names the framework
and the model it used.
"""

from __future__ import annotations

from typing import Any

from adaptcheck.base.schemas.framework_evidence import FrameworkCheckEvidence
from adaptcheck.frameworks.weights_audit import ROW_WEIGHTS
from adaptcheck.ladder.check import Check, CheckContext, Outcome
from adaptcheck.steps.frameworks import probes
from adaptcheck.steps.frameworks.lifecycle import Active, not_loaded, run_with_framework
from adaptcheck.steps.frameworks.params import (
    CompileParams,
    ConcurrentParams,
    FrameworkParams,
    KvCacheParams,
    LoadParams,
    ReferenceParams,
    SingleRequestParams,
    TensorParallelParams,
)


class FrameworkCheck(Check):
    """Base of the lifecycle kinds: every outcome names its framework, even one the runner writes."""

    @classmethod
    def identity(cls, params: FrameworkParams) -> dict[str, Any]:
        # A crashed or timed-out check still belongs to its framework's block in the report.
        return FrameworkCheckEvidence(framework=not_loaded(params.framework)).dump()


class FrameworkLoadCheck(FrameworkCheck):
    """The framework loads the model on the device (and how long model and load took).

    A local model folder is audited first (``weights_audit``): weights that do not cover
    config.json (MISSING, UNEXPECTED or MISMATCHED tensors) or a tokenizer with ids past the
    embedding fail this check naming them, and the folder is never loaded.
    """

    kind = "framework.load"
    step = 4
    description = ("The framework loads the model on the device (after a header-only audit: the weights cover "
                   "config.json, the tokenizer fits the embedding); load time and platform facts.")
    params_model = LoadParams

    def run(self, ctx: CheckContext, params: LoadParams) -> Outcome:
        return run_with_framework(ctx, params, _load_and_audit, refusal_fails=True)


def _load_and_audit(ctx: CheckContext, active: Active, _params: LoadParams) -> Outcome:
    """The load's outcome, with the weights audit's rows (which held: a refused folder never loads)."""
    outcome = probes.load_outcome(ctx, active)
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
    outcome.details["subchecks"] = [*outcome.details.get("subchecks", []), *rows]
    return outcome


class SingleRequestCheck(FrameworkCheck):
    """One request at a time: lengths, long input, max_tokens, stop strings, EOS."""

    kind = "framework.single_request"
    step = 4
    description = "Single requests: short/long input, several output lengths, max_tokens, stop strings and EOS honoured."
    params_model = SingleRequestParams

    def run(self, ctx: CheckContext, params: SingleRequestParams) -> Outcome:
        return run_with_framework(ctx, params, probes.single_request)


class ReferenceCheck(FrameworkCheck):
    """Greedy answers match the CPU float64 reference of the same weights."""

    kind = "framework.reference"
    step = 4
    description = "Greedy token ids match a CPU float64 reference of the same weights (top-N rule at a divergence)."
    params_model = ReferenceParams

    def run(self, ctx: CheckContext, params: ReferenceParams) -> Outcome:
        return run_with_framework(ctx, params, probes.reference)


class ConcurrentCheck(FrameworkCheck):
    """The same prompts alone and in a concurrent batch give the same answers."""

    kind = "framework.concurrent"
    step = 4
    description = "Alone vs inside a concurrent batch gives the same tokens; stream vs non-stream; usage counts."
    params_model = ConcurrentParams

    def run(self, ctx: CheckContext, params: ConcurrentParams) -> Outcome:
        return run_with_framework(ctx, params, probes.concurrent)


class KvCacheCheck(FrameworkCheck):
    """Repeated rounds give the same answers and leave KV cache / memory at baseline; prefix cache."""

    kind = "framework.kv_cache"
    step = 4
    description = "Many requests leave the KV cache and memory at baseline; prefix-cache hits give the same tokens."
    params_model = KvCacheParams

    def run(self, ctx: CheckContext, params: KvCacheParams) -> Outcome:
        return run_with_framework(ctx, params, probes.kv_cache)


class CompileCheck(FrameworkCheck):
    """Graph capture / compile on and off give the same tokens, where the framework has the switch."""

    kind = "framework.compile"
    step = 4
    description = "Graph capture / torch.compile on vs off give the same tokens (where supported)."
    params_model = CompileParams

    def run(self, ctx: CheckContext, params: CompileParams) -> Outcome:
        return probes.toggle(ctx, params, toggle="compile")


class TensorParallelCheck(FrameworkCheck):
    """Tensor parallel over every device gives the same tokens as one device."""

    kind = "framework.tensor_parallel"
    step = 4
    description = "Tensor-parallel bring-up over every device, compared with one device (when >1 device)."
    params_model = TensorParallelParams

    def run(self, ctx: CheckContext, params: TensorParallelParams) -> Outcome:
        return probes.toggle(ctx, params, toggle="tensor_parallel")
