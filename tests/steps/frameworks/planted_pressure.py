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
    """A preempted request resumes on its stale block table: the scheduler no longer tells the
    model runner that the request was resumed, so the runner appends the newly allocated blocks
    after the freed ones instead of replacing them, and the recomputed request reads and writes
    KV blocks it no longer owns (some already handed to other requests)."""

    display_name = "planted: preempted requests resume on stale KV blocks"

    def patch(self) -> Callable[[], None]:
        from vllm.v1.core.sched.scheduler import Scheduler

        original = Scheduler._make_cached_request_data

        def forgets_resumes(sched: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(sched, *args, **kwargs)
            out.resumed_req_ids = set()
            return out

        Scheduler._make_cached_request_data = forgets_resumes  # type: ignore[method-assign]

        def undo() -> None:
            Scheduler._make_cached_request_data = original  # type: ignore[method-assign]

        return undo
