"""Step-4 check kinds: a real framework serves the model correctly, alone, batched and cached.

Every kind takes ``framework:`` (transformers, vllm, vllm_serve, transformers_serve,
endpoint, or a plugin) and shares the loaded instance with the checks after it (see
``session``). A framework that is not installed, or an endpoint that was not given, is a
``skip`` marked not applicable, with the reason; a model or server that fails is an
``error`` with a one-line message, and the run goes on. Each outcome names the framework
and the model it used.
"""

from __future__ import annotations

from adaptcheck.ladder.check import Check, CheckContext, Outcome
from adaptcheck.steps.framework import probes
from adaptcheck.steps.framework.lifecycle import run_with_framework
from adaptcheck.steps.framework.params import (
    CompileParams,
    ConcurrentParams,
    KvCacheParams,
    LoadParams,
    ReferenceParams,
    SingleRequestParams,
    TensorParallelParams,
)


class FrameworkLoadCheck(Check):
    """The framework loads the model on the device (and how long model and load took)."""

    kind = "framework.load"
    step = 4
    description = "The framework loads the model on the device; load time and platform facts."
    params_model = LoadParams

    def run(self, ctx: CheckContext, params: LoadParams) -> Outcome:
        return run_with_framework(ctx, params, lambda c, a, _: probes.load_outcome(c, a))


class SingleRequestCheck(Check):
    """One request at a time: lengths, long input, max_tokens, stop strings, EOS."""

    kind = "framework.single_request"
    step = 4
    description = "Single requests: short/long input, several output lengths, max_tokens, stop strings and EOS honoured."
    params_model = SingleRequestParams

    def run(self, ctx: CheckContext, params: SingleRequestParams) -> Outcome:
        return run_with_framework(ctx, params, probes.single_request)


class ReferenceCheck(Check):
    """Greedy answers match the CPU float64 reference of the same weights."""

    kind = "framework.reference"
    step = 4
    description = "Greedy token ids match a CPU float64 reference of the same weights (top-N rule at a divergence)."
    params_model = ReferenceParams

    def run(self, ctx: CheckContext, params: ReferenceParams) -> Outcome:
        return run_with_framework(ctx, params, probes.reference)


class ConcurrentCheck(Check):
    """The same prompts alone and in a concurrent batch give the same answers."""

    kind = "framework.concurrent"
    step = 4
    description = "Alone vs inside a concurrent batch gives the same tokens; stream vs non-stream; usage counts."
    params_model = ConcurrentParams

    def run(self, ctx: CheckContext, params: ConcurrentParams) -> Outcome:
        return run_with_framework(ctx, params, probes.concurrent)


class KvCacheCheck(Check):
    """Repeated rounds give the same answers and leave KV cache / memory at baseline; prefix cache."""

    kind = "framework.kv_cache"
    step = 4
    description = "Many requests leave the KV cache and memory at baseline; prefix-cache hits give the same tokens."
    params_model = KvCacheParams

    def run(self, ctx: CheckContext, params: KvCacheParams) -> Outcome:
        return run_with_framework(ctx, params, probes.kv_cache)


class CompileCheck(Check):
    """Graph capture / compile on and off give the same tokens, where the framework has the switch."""

    kind = "framework.compile"
    step = 4
    description = "Graph capture / torch.compile on vs off give the same tokens (where supported)."
    params_model = CompileParams

    def run(self, ctx: CheckContext, params: CompileParams) -> Outcome:
        return probes.toggle(ctx, params, toggle="compile")


class TensorParallelCheck(Check):
    """Tensor parallel over every device gives the same tokens as one device."""

    kind = "framework.tensor_parallel"
    step = 4
    description = "Tensor-parallel bring-up over every device, compared with one device (when >1 device)."
    params_model = TensorParallelParams

    def run(self, ctx: CheckContext, params: TensorParallelParams) -> Outcome:
        return probes.toggle(ctx, params, toggle="tensor_parallel")
