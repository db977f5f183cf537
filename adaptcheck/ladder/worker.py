"""The isolated worker process that executes checks.

The runner starts ``python -m adaptcheck.ladder.worker CMD_FD RES_FD`` in its own process
session, sends one JSON line to set up the context, then one JSON line per check, and
reads one JSON line back per check on a dedicated pipe (so whatever a check or a vendor
library prints to stdout cannot corrupt the protocol; stdout/stderr go to worker.log).
Before its reply a long check may send progress lines, ``{"id": ..., "progress": {"done",
"total", "unit", "note"}}`` (:meth:`CheckContext.progress`); the runner shows them and keeps
waiting for the reply.
If a check segfaults, aborts or hangs, only this process dies; the runner records the
check as ``error`` and starts a fresh worker for the next one.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adaptcheck.ladder.check import CheckContext
    from adaptcheck.ladder.protocol import CheckRequest, ProgressMessage, WorkerInit, WorkerReply


def _watch_parent(parent_pid: int) -> None:
    """Exit when the runner is gone (e.g. SIGKILLed), so no worker is ever orphaned."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(3)


def _context(init: WorkerInit) -> CheckContext:
    from adaptcheck.backends.registry import get_backend
    from adaptcheck.base.schemas.deployment import Deployment
    from adaptcheck.base.schemas.ladder import ModelSpec
    from adaptcheck.ladder.check import CheckContext

    deployment = init.get("deployment")
    return CheckContext(
        backend=get_backend(init["backend"]),
        device_index=int(init["device_index"]),
        seed=int(init["seed"]),
        run_dir=Path(init["run_dir"]),
        model=ModelSpec.model_validate(init["model"]),
        device_count=int(init.get("device_count", 1)),
        op_provider=init.get("op_provider"),
        endpoint=init.get("endpoint"),
        deployment=Deployment.model_validate(deployment) if deployment else None,
        reference_memory=init.get("reference_memory"),
    )


def _run_one(ctx: CheckContext, msg: CheckRequest) -> WorkerReply:
    from adaptcheck.base.errors import exception_line, missing_dependency
    from adaptcheck.ladder.check import Outcome
    from adaptcheck.ladder.protocol import WorkerReply
    from adaptcheck.ladder.registry import get_check_class

    start = time.perf_counter()
    try:
        ctx.begin_check(msg["id"])
        cls = get_check_class(msg["kind"])
        params = cls.params_model.model_validate(msg.get("params") or {})
        got = cls().run(ctx, params)
        outcomes = got if isinstance(got, list) else [got]
        if not outcomes:
            raise RuntimeError("check returned no outcome")
        payload = [Outcome.model_validate(o) for o in outcomes]
        return WorkerReply(id=msg["id"], outcomes=payload, duration_s=time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - a Python error in a check is its result, not the worker's death
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        missing = missing_dependency(exc)
        if missing:  # an optional package the check needs is absent: it cannot run here (n/a), no crash
            return WorkerReply(id=msg["id"], outcomes=[Outcome.skipped(f"needs an optional package: {missing}",
                                                                       applicable=False)],
                               duration_s=time.perf_counter() - start)
        return WorkerReply(id=msg["id"], exception=exception_line(exc, limit=2000), traceback=tb[-4000:],
                           duration_s=time.perf_counter() - start)


def main(argv: list[str]) -> int:
    cmd_fd, res_fd = int(argv[0]), int(argv[1])
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    cmd = os.fdopen(cmd_fd, "r", encoding="utf-8")
    res = os.fdopen(res_fd, "w", encoding="utf-8")
    lock = threading.Lock()  # a check's progress thread and the main thread share the pipe

    def send(obj: WorkerReply | ProgressMessage) -> None:
        from adaptcheck.ladder.protocol import WorkerReply

        # Plain json (not pydantic's): NaN and inf in a check's figures must reach the runner as such.
        data = obj.model_dump(mode="json", exclude_unset=True) if isinstance(obj, WorkerReply) else obj
        line = json.dumps(data, default=str) + "\n"
        with lock:
            res.write(line)
            res.flush()

    init: WorkerInit | None = json.loads(cmd.readline() or "null")
    if init is None:
        return 0
    from adaptcheck.ladder.protocol import WorkerReply

    try:
        ctx = _context(init)
    except Exception as exc:  # noqa: BLE001
        send(WorkerReply(ready=False, error=f"{type(exc).__name__}: {exc}"))
        return 1
    ctx.progress_sink = send
    send(WorkerReply(ready=True, pid=os.getpid()))
    for line in cmd:
        if not line.strip():
            continue
        send(_run_one(ctx, json.loads(line)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
