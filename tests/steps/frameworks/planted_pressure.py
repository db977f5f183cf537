"""Defects planted in vLLM's KV-cache pressure paths (preemption, chunked prefill), for the
``framework.preemption`` and ``framework.long_context`` tests.

Each adapter is the real in-process vLLM adapter whose ``load()`` patches one vLLM v1 method in
this process, and whose ``shutdown()`` puts it back. In-process vLLM runs its engine core and
scheduler in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a patch made here reaches
the engine. Ladders name them as ``framework: "tests.steps.frameworks.planted_pressure:NAME"``.
The plain instance of a feature check loads the same adapter, but it never preempts and never
chunks a prompt (its cache and token budget are large), so the defects only bite under pressure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adaptcheck.frameworks.base import LoadOptions
from adaptcheck.frameworks.vllm_fw import VllmFramework


class _Patched(VllmFramework):
    """Installs :meth:`patch` for as long as the engine is loaded."""

    def patch(self) -> Callable[[], None]:
        """Install the defect; return what undoes it."""
        raise NotImplementedError

    def load(self, opts: LoadOptions, device: str) -> float:
        self._undo: Callable[[], None] | None = self.patch()
        return super().load(opts, device)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            undo, self._undo = getattr(self, "_undo", None), None
            if undo is not None:
                undo()


class PreemptStaleBlocks(_Patched):
    """A preempted request resumes on its stale blocks: the scheduler remembers the block ids a
    request held when it was preempted (and freed), and when the request resumes it hands the
    model runner those stale ids in place of the newly allocated ones, as many as both lists
    have. The recomputed request then reads and writes KV blocks it no longer owns (some
    already given to other requests), while the block table keeps its length (no crash)."""

    display_name = "planted: preempted requests resume on stale KV blocks"

    def patch(self) -> Callable[[], None]:
        from vllm.v1.core.sched.scheduler import Scheduler

        preempt, cached = Scheduler._preempt_request, Scheduler._make_cached_request_data

        def remembers(sched: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            stale = getattr(sched, "_planted_stale", None)
            if stale is None:
                stale = sched._planted_stale = {}
            stale[request.request_id] = [list(ids) for ids in sched.kv_cache_manager.get_block_ids(request.request_id)]
            return preempt(sched, request, *args, **kwargs)

        def resumes_stale(sched: Any, *args: Any, **kwargs: Any) -> Any:
            out = cached(sched, *args, **kwargs)
            stale = getattr(sched, "_planted_stale", {})
            for i, req_id in enumerate(out.req_ids):
                old, new = stale.pop(req_id, None), out.new_block_ids[i]
                if req_id in out.resumed_req_ids and old is not None and new is not None:
                    for group_old, group_new in zip(old, new, strict=False):
                        n = min(len(group_old), len(group_new))
                        group_new[:n] = group_old[:n]
            return out

        Scheduler._preempt_request = remembers  # type: ignore[method-assign]
        Scheduler._make_cached_request_data = resumes_stale  # type: ignore[method-assign]

        def undo() -> None:
            Scheduler._preempt_request = preempt  # type: ignore[method-assign]
            Scheduler._make_cached_request_data = cached  # type: ignore[method-assign]

        return undo


class ChunkPositionsRestart(_Patched):
    """Every prefill chunk after the first is positioned as if it started the sequence: the
    rotary offset restarts at 0 at each chunk boundary instead of continuing from the tokens
    already in the cache. A prompt prefilled in one step, and single-token decode steps, are
    untouched, so only chunked prefill meets it."""

    display_name = "planted: chunked prefill restarts positions at each chunk"

    def patch(self) -> Callable[[], None]:
        from vllm.model_executor.models.llama import LlamaForCausalLM

        original = LlamaForCausalLM.forward

        def restarts(model: Any, input_ids: Any, positions: Any, *args: Any, **kwargs: Any) -> Any:
            if positions is not None and positions.dim() == 1 and positions.numel() > 1:
                first = int(positions[0])
                consecutive = int(positions[-1]) - first == positions.numel() - 1
                if first > 0 and consecutive:
                    positions = positions - first
            return original(model, input_ids, positions, *args, **kwargs)

        LlamaForCausalLM.forward = restarts  # type: ignore[method-assign]

        def undo() -> None:
            LlamaForCausalLM.forward = original  # type: ignore[method-assign]

        return undo
