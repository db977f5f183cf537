"""Step 4: multi-device collectives, checked exactly (``framework.collectives``).

The check plans the run, launches one process per rank and judges their records; the
library it drives is :mod:`adaptcheck.collectives` (status policy: :mod:`adaptcheck.collectives.plan`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from adaptcheck.base.plugins import class_ref, import_root, load_ref
from adaptcheck.collectives.launch import launch
from adaptcheck.collectives.plan import (
    CollectivesParams,
    make_plan,
    resolve_world_size,
    summarize,
)
from adaptcheck.ladder.check import Check, CheckContext, Outcome


class CollectivesCheck(Check):
    """all-reduce, all-gather, reduce-scatter, all-to-all and broadcast return exact results on every rank."""

    kind = "framework.collectives"
    step = 4
    description = ("Collectives through torch.distributed and the backend's collective library, one process per "
                   "device, give exact results on every rank.")
    params_model = CollectivesParams
    label = "collectives"
    typical_s = 10.0

    def run(self, ctx: CheckContext, params: CollectivesParams) -> Outcome:
        backend = ctx.backend
        ws, why = resolve_world_size(backend, ctx.device_count, params.world_size)
        if ws is None:
            single = params.world_size is None
            return Outcome.skipped(why, applicable=not single,
                                   details={"device_count": ctx.device_count, "library": backend.collective_library})
        plan = make_plan(backend, params, ws)
        if not plan.dtypes:
            return Outcome.skipped("no dtype can be checked exactly: " + "; ".join(
                f"{d}: {why}" for d, why in plan.skipped_dtypes.items()), details={"skipped_dtypes": plan.skipped_dtypes})
        # Importing the override and the backend class here fails early, in this process, with
        # a clear error; their sys.path roots go to the ranks so fresh interpreters find them.
        roots: list[str] = []
        backend_ref = class_ref(type(backend))
        for ref in ([params.impl] if params.impl else []) + [backend_ref]:
            try:
                load_ref(ref)
                root = import_root(ref.partition(":")[0])
            except (ImportError, AttributeError) as exc:
                return Outcome.errored(f"cannot load {ref}: {type(exc).__name__}: {exc}")
            if root:
                roots.append(root)
        config = {"backend": backend.name, "backend_class": backend_ref, "ops": plan.ops, "dtypes": plan.dtypes,
                  "elements": plan.elements, "impl": params.impl, "timeout_s": params.timeout_s}
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        logs_dir = Path(tempfile.mkdtemp(prefix="collectives-", dir=ctx.run_dir))
        launched = launch(config, ws, timeout_s=params.timeout_s, crash_grace_s=params.crash_grace_s,
                          logs_dir=logs_dir, extra_pythonpath=roots)
        outcome = summarize(plan, launched)
        if params.impl:
            outcome.details["impl"] = params.impl
        return outcome
