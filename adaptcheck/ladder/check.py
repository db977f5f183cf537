"""The Check contract.

A check kind has a name used in ladder YAML, a strict pydantic params model, a step, and
``run(ctx, params) -> Outcome`` (or a list of outcomes, each with a ``subid``, for checks
that expand into several results such as one per compatibility rule). Checks run in an
isolated worker process; they never return ``pass`` for something they could not do —
``skip`` (with the reason) or ``error`` instead. How to add one: docs/adding-a-check-kind.md.
"""

from __future__ import annotations

import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict  # pydantic validates these (typing.TypedDict only from 3.12)

from adaptcheck.base.schemas.evidence import Evidence
from adaptcheck.base.schemas.results import Status

if TYPE_CHECKING:
    import torch

    from adaptcheck.backends.base import Backend
    from adaptcheck.base.schemas.deployment import Deployment
    from adaptcheck.base.schemas.ladder import ModelSpec

PROGRESS_MIN_INTERVAL_S = 0.5
"""Progress messages of one check are at least this far apart: a check may call
:meth:`CheckContext.progress` in a tight loop without flooding the result pipe."""
TICK_INTERVAL_S = 1.0
"""How often :meth:`CheckContext.timed_progress` reports the elapsed time."""


class EndpointTarget(TypedDict):
    """``--endpoint``: the server under test."""

    url: str
    model: str | None
    reference: bool
    """True when ``--model`` names a local copy of the served weights (a CPU reference is possible)."""


class ProgressReport(TypedDict):
    """How far a running check is (:meth:`CheckContext.progress`), e.g. 120 of 300 s."""

    done: float
    total: float | None
    unit: str
    note: str


class ProgressMessage(TypedDict):
    """A progress line: the check it belongs to, and its report."""

    id: str
    progress: ProgressReport


class NoParams(BaseModel):
    """Params model of kinds that take none."""

    model_config = ConfigDict(extra="forbid")


class Outcome(BaseModel):
    """What a check returns."""

    model_config = ConfigDict(extra="forbid")

    status: Status = Field(description="pass | fail | error | skip.")
    message: str = Field(default="", description="One-line summary.")
    metrics: dict[str, Any] = Field(default_factory=dict, description="Numbers measured.")
    details: dict[str, Any] = Field(default_factory=dict, description="Structured evidence.")
    applicable: bool = Field(default=True, description="False when the backend lacks the capability.")
    subid: str | None = Field(default=None, description="For expanding checks: suffix appended to the check id.")

    @classmethod
    def passed(cls, message: str = "", **kw: Any) -> Outcome:
        return cls(status=Status.PASS, message=message, **kw)

    @classmethod
    def failed(cls, message: str, **kw: Any) -> Outcome:
        return cls(status=Status.FAIL, message=message, **kw)

    @classmethod
    def skipped(cls, message: str, *, applicable: bool = True, **kw: Any) -> Outcome:
        return cls(status=Status.SKIP, message=message, applicable=applicable, **kw)

    @classmethod
    def errored(cls, message: str, **kw: Any) -> Outcome:
        return cls(status=Status.ERROR, message=message, **kw)


@dataclass
class CheckContext:
    """Everything a check may use. Built once per worker process."""

    backend: Backend
    device_index: int
    seed: int
    run_dir: Path
    model: ModelSpec
    device_count: int = 1
    op_provider: str | None = None
    """Provider for every step-3 op check (``--ops``), overriding the ladder's choice."""
    endpoint: EndpointTarget | None = None
    """``--endpoint``: the server under test."""
    deployment: Deployment | None = None
    """``--serve``: the deployment under test (its model, engine arguments, TP/PP size); None: adaptcheck's
    own, where each check chooses its engine arguments (docs/deployment.md)."""
    reference_memory: int | None = None
    """``--reference-memory``: bytes the CPU float64 reference may hold at once (None: half of the host's
    free memory); past it the reference streams the weights a decoder layer at a time."""
    check_id: str = ""
    """Id of the check being run (set by the worker before each check)."""
    scratch: dict[str, Any] = field(default_factory=dict)
    progress_sink: Callable[[ProgressMessage], None] | None = None
    """Where :meth:`progress` sends its messages: set by the worker (the result pipe); None
    outside a worker (tests, the in-process report), where progress is a no-op."""
    _last_progress: float = field(default=-1e9, init=False, repr=False)
    _progress_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def begin_check(self, check_id: str) -> None:
        """Set the check about to run (the worker calls this): its progress messages carry its
        id, and its first one is never held back by the previous check's last."""
        self.check_id = check_id
        with self._progress_lock:
            self._last_progress = -1e9

    def progress(self, done: float, total: float | None = None, unit: str = "", note: str = "") -> None:
        """Tell the runner how far this check is (e.g. 120 of 300 s, 3 of 6 runs).

        Shown live next to the progress bar; it never changes the check's result or its time
        limit. Messages closer than :data:`PROGRESS_MIN_INTERVAL_S` to the previous one are
        dropped (a later one carries the news), so calling it often is cheap. Thread-safe.
        """
        sink = self.progress_sink
        if sink is None:
            return
        with self._progress_lock:
            now = time.monotonic()
            if now - self._last_progress < PROGRESS_MIN_INTERVAL_S:
                return
            self._last_progress = now
            try:
                sink({"id": self.check_id, "progress": {"done": done, "total": total, "unit": unit, "note": note}})
            except Exception:  # noqa: BLE001 - progress is informative; a broken pipe surfaces with the result
                self.progress_sink = None

    @contextmanager
    def timed_progress(self, planned_s: float, note: str = "") -> Iterator[None]:
        """Report the elapsed seconds against ``planned_s`` about every second while the body
        runs (for a blocking call such as a soak's load run). No thread outside a worker."""
        if self.progress_sink is None:
            yield
            return
        stop = threading.Event()
        start = time.monotonic()

        def tick() -> None:
            while not stop.wait(TICK_INTERVAL_S):
                self.progress(round(time.monotonic() - start, 1), planned_s, "s", note)

        thread = threading.Thread(target=tick, name="adaptcheck-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)  # no message of this check may follow its result

    @property
    def device(self) -> torch.device:
        return self.backend.torch_device(self.device_index)

    def generator(self, salt: str = "") -> torch.Generator:
        """A CPU torch generator seeded from the run seed and a per-check salt (reproducible)."""
        import torch

        g = torch.Generator(device="cpu")
        g.manual_seed(self.seed_for(salt))
        return g

    def seed_for(self, salt: str) -> int:
        """Deterministic per-check seed: same run seed + same check → same inputs."""
        return random.Random(f"{self.seed}:{salt}").randrange(2**31)


class Check(ABC):
    """Base of every check kind."""

    kind: ClassVar[str]
    """Name used in ladder YAML (the entry-point name)."""
    step: ClassVar[int]
    """Ladder step it belongs to (a ladder may not put it elsewhere); 0 = usable in any step."""
    description: ClassVar[str] = ""
    """What it proves, one line."""
    params_model: ClassVar[type[BaseModel]] = NoParams
    """Strict params model (extra keys forbidden)."""
    label: ClassVar[str | None] = None
    """Short name the report shows for it (e.g. 'alone vs batched'); recorded with every result
    (``CheckResult.kind_label``). None: the report shows the kind name."""
    typical_s: ClassVar[float | None] = None
    """Typical seconds it takes (quick ladder, 2-core CPU) for the run's time estimate; None:
    its family's typical time (:mod:`adaptcheck.ladder.estimate`)."""
    compares: ClassVar[str | None] = None
    """For a kind that compares two runs of one framework: what the two runs are (e.g.
    'batched vs alone'), recorded with every result (``CheckResult.compares``). None otherwise."""

    @classmethod
    def identity(cls, params: Any) -> Evidence | None:
        """Evidence every outcome of this check carries, known from its params alone.

        The runner writes it into the result it makes in a check's place (the worker raised,
        crashed or timed out), so a reader still knows what the check was about (step 4: which
        framework) without guessing from its id. None by default.
        """
        return None

    @abstractmethod
    def run(self, ctx: CheckContext, params: Any) -> Outcome | list[Outcome]:
        """Do the check. ``params`` is an instance of ``params_model``."""
