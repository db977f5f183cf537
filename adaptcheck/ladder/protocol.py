"""The messages between the runner and its worker process, typed (the check contract: docs/adding-a-check-kind.md).

The runner sends a :class:`WorkerInit` line, then one :class:`CheckRequest` line per check; the
worker answers each with :class:`ProgressMessage` lines while the check runs and one
:class:`WorkerReply` line at its end. Lines are JSON; the runner validates each reply with
:class:`WorkerReply`, so a malformed line is an error it reports, not a missing key later.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import NotRequired, TypedDict  # pydantic validates these (typing.TypedDict only from 3.12)

# The context-facing messages live with CheckContext (a check sends them); imported here so the
# protocol reads as one list, and so check.py needs nothing from this module (no cycle).
from adaptcheck.ladder.check import EndpointTarget, Outcome, ProgressMessage, ProgressReport

__all__ = ["CheckRequest", "EndpointTarget", "ProgressMessage", "ProgressReport", "WorkerInit", "WorkerReply"]


class WorkerInit(TypedDict):
    """The first line the worker reads: what its :class:`~adaptcheck.ladder.check.CheckContext` is built from."""

    backend: str
    device_index: int
    seed: int
    run_dir: str
    model: dict[str, object]
    """The run's ``ModelSpec`` as JSON (validated again by the worker)."""
    device_count: int
    op_provider: str | None
    endpoint: EndpointTarget | None
    deployment: NotRequired[dict[str, object] | None]
    """``--serve``: the run's ``Deployment`` as JSON (validated again by the worker); None without one."""
    reference_memory: NotRequired[int | None]
    """``--reference-memory`` in bytes; None: the default (half of the host's free memory)."""


class CheckRequest(TypedDict):
    """One check for the worker to run."""

    id: str
    kind: str
    params: dict[str, object]
    """The ladder's params for it, validated by the kind's ``params_model`` in the worker."""


class WorkerReply(BaseModel):
    """Any line the worker answers: start-up, progress, or a check's end (outcomes or exception)."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = Field(default=None, description="The check the line is about; None for the start-up line.")
    ready: bool | None = Field(default=None, description="Start-up: whether the device context is set up.")
    pid: int | None = Field(default=None, description="Start-up: the worker's process id.")
    error: str | None = Field(default=None, description="Start-up: why the context could not be set up.")
    progress: ProgressReport | None = Field(default=None, description="A progress line's report.")
    outcomes: list[Outcome] | None = Field(default=None, description="The check's outcomes, when it returned.")
    exception: str | None = Field(default=None, description="'Type: message' of what the check raised.")
    traceback: str = Field(default="", description="The end of the traceback of what it raised.")
    duration_s: float = Field(default=0.0, description="Wall time of the check in the worker.")

    @property
    def is_progress(self) -> bool:
        """A progress line (the check has not ended yet)."""
        return self.progress is not None and self.outcomes is None and self.exception is None
