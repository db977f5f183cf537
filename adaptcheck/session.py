"""A run from start to report: the one library function behind ``adaptcheck run``.

Lays out the run folder (``run.json`` with what is needed to reproduce or resume,
``ladder.yaml`` snapshot, ``checks.jsonl`` journal, ``worker.log``, and ``baseline.json``
with ``--baseline``), executes the selected checks through the isolated runner, and writes
``results.json`` and ``report.html``. A run that was killed is finished by
:func:`resume_run` from the same folder. Either holds the folder's lock (``run.lock``, see
:mod:`adaptcheck.base.runlock`) from before anything runs in it until it ends.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from adaptcheck.backends.base import Backend
from adaptcheck.backends.registry import get_backend, select_backend
from adaptcheck.base.errors import DeviceError, IntegrityError, InvalidInputError, UsageError, exception_line
from adaptcheck.base.paths import default_reports_dir
from adaptcheck.base.runlock import LOCK_FILE, RunLock
from adaptcheck.base.runlock import acquire as acquire_lock
from adaptcheck.base.schemas.deployment import Deployment
from adaptcheck.base.schemas.ladder import CheckSpec, LadderSpec
from adaptcheck.base.schemas.results import (
    CheckResult,
    DeviceRef,
    LadderRef,
    RunResults,
    utcnow,
)
from adaptcheck.ladder.loader import load_ladder, parse_ladder
from adaptcheck.ladder.protocol import ProgressReport, WorkerInit
from adaptcheck.ladder.runner import JournalWriter, PlannedRun, execute
from adaptcheck.runfolder import (
    BASELINE,
    JOURNAL,
    LADDER_SNAPSHOT,
    RUN_META,
    WORKER_LOG,
    RunMeta,
    assemble,
    run_deployment,
    stored_meta,
    with_run_model,
    write_outputs,
)

if TYPE_CHECKING:
    from adaptcheck.frameworks.server import ManagedServer


@dataclass
class RunOptions:
    """What ``adaptcheck run`` was asked for."""

    ladder: str = "quick"
    device: str | None = None
    steps: list[int] | None = None
    out: Path | None = None
    seed: int = 0
    ops: str | None = None
    model: str | None = None
    endpoint: str | None = None
    endpoint_model: str | None = None
    baseline: Path | None = None
    allow_unverified: bool = False  # use a --baseline edited after its run or without digest (marked)
    command: list[str] = field(default_factory=list)
    serve: str | None = None
    """``--serve``: the command the user deploys (docs/deployment.md)."""
    reference_memory: int | None = None
    """``--reference-memory`` in bytes (None: half of the host's free memory)."""


class Progress:
    """Callbacks the CLI implements to show progress; the default shows nothing."""

    def planned(self, checks: list[CheckSpec]) -> None: ...

    def started(self, spec: CheckSpec) -> None: ...

    def finished(self, spec: CheckSpec, results: list[CheckResult]) -> None: ...

    def note(self, text: str) -> None:
        """Something the user should know about the run folder (e.g. a repaired journal)."""

    def header(self, header: RunHeader) -> None:
        """What is about to run, on what, where it goes and how long it should take: once, first."""

    def progress(self, spec: CheckSpec, report: ProgressReport) -> None:
        """A running check's progress (CheckContext.progress)."""


@dataclass(frozen=True)
class RunHeader:
    """What ``adaptcheck run`` says before its first check."""

    device: str
    ladder: str
    model: str
    run_dir: Path
    steps: list[int]
    checks: int
    already_done: int
    """Checks a resumed run finds in its journal (they do not run again)."""
    expected: str
    """Expected duration of the checks still to run, e.g. 'about 21 min' (adaptcheck.ladder.estimate)."""
    endpoint: str | None = None
    deployment: str = ""
    """The deployment under test, one line (:meth:`Deployment.summary`)."""


def run_header(run_dir: Path, meta: RunMeta, spec: LadderSpec, selected: list[CheckSpec],
               done: dict[str, list[CheckResult]]) -> RunHeader:
    """The header of a run (or of a resumed run: only what is left is estimated)."""
    from adaptcheck.ladder.estimate import estimate

    d = meta.device
    todo = [c for c in selected if c.id not in done]
    return RunHeader(
        device=f"{d.device_name} ({d.display_name}, {d.torch_device}, {d.device_count} visible)",
        ladder=f"{meta.ladder.id} {meta.ladder.version} ({meta.ladder.source})",
        model=_model_line(spec),
        run_dir=run_dir, steps=list(meta.steps), checks=len(selected),
        already_done=len(selected) - len(todo), expected=estimate(todo, _runs_here(meta.endpoint)).text(),
        endpoint=meta.endpoint, deployment=run_deployment(meta, spec).summary())


def _model_line(spec: LadderSpec) -> str:
    """'pretrained:… (bf16; families: dense)', with the family reading's problem when there is one."""
    m = spec.model
    quant = "" if m.quantization == "none" else f", {m.quantization}"
    families = f"; families: {', '.join(m.families)}" if m.families else ""
    note = f" — {m.family_note}" if m.family_note else ""
    return f"{_model_label(m.name)} ({m.precision}{quant}{families}){note}"


def _runs_here(endpoint: str | None) -> Callable[[CheckSpec], bool]:
    """Whether a check will run here rather than skip at once, for the header's estimate: its
    ``framework`` is installed and has something to talk to, its op ``provider`` is installed.
    Asked of the adapters and providers themselves (no names known here); each answer is
    cached, and anything that cannot be answered counts as running (the estimate errs long)."""
    from functools import cache

    from adaptcheck.frameworks.base import FrameworkConfig
    from adaptcheck.frameworks.registry import framework_class
    from adaptcheck.steps.ops.providers.registry import load_provider

    @cache
    def framework_runs(name: str) -> bool:
        cls = framework_class(name)
        return cls.availability().available and cls.unconfigured(FrameworkConfig(endpoint_url=endpoint)) is None

    @cache
    def provider_runs(name: str) -> bool:
        installed = getattr(load_provider(name), "installed", None)  # a plain provider object has none
        return bool(installed()) if callable(installed) else True

    def runs_here(spec: CheckSpec) -> bool:
        params = spec.params or {}
        try:
            if isinstance(params.get("framework"), str) and not framework_runs(params["framework"]):
                return False
            if isinstance(params.get("provider"), str) and not provider_runs(params["provider"]):
                return False
        except Exception:  # noqa: BLE001 - a header estimate must never stop a run
            return True
        return True

    return runs_here


def _model_label(name: str) -> str:
    """The model as the header names it: ``auto`` with what it stands for here."""
    now = _auto_now(name)
    return name if now is None else f"auto = {now}"


def parse_steps(text: str | None, available: list[int]) -> list[int]:
    """'2,3' or '1-3' → [2, 3]; None → every step of the ladder.

    A value that selects nothing ('', ',,,', '3-1') is a usage error: running every step
    instead would silently do something else than was asked (and take far longer).
    """
    if text is None:
        return sorted(available)
    example = "e.g. --steps 1,2 or --steps 2-3, or leave --steps out to run every step"
    steps: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise UsageError(f"--steps {text!r}: range {part} runs backwards", hint=f"write {hi}-{lo}")
                steps.update(range(lo, hi + 1))
            elif part:
                steps.add(int(part))
    except ValueError:
        raise UsageError(f"--steps {text!r} is not a list of step numbers", hint=example) from None
    if not steps:
        raise UsageError(f"--steps {text!r} selects no step", hint=example)
    bad = sorted(s for s in steps if s not in range(1, 6))
    if bad:
        raise UsageError(f"--steps: no step {bad[0]}", hint="steps are 1-5 (6, the grade, always runs)")
    return sorted(steps)


def _device_ref(backend: Backend, index: int, count: int) -> DeviceRef:
    try:
        name = backend.device_name(index)
    except Exception as exc:  # noqa: BLE001 - the name is informative only
        name = f"{backend.display_name} (name unavailable: {type(exc).__name__})"
    return DeviceRef(backend=backend.name, display_name=backend.display_name,
                     torch_device=str(backend.torch_device(index)), device_name=name, device_count=count)


def new_run_dir(out: Path | None, run_id: str) -> tuple[Path, RunLock]:
    """``--out DIR`` as given (must be empty or new), else reports/<run_id>/, and its lock, held."""
    target = out if out is not None else default_reports_dir() / run_id
    _make_writable_dir(target, given=out is not None)  # exists from here on
    # Checked before locking too, so a folder of someone else's files gets no run.lock left in it.
    if _holds_files(target):
        if (target / LOCK_FILE).exists():
            acquire_lock(target, "adaptcheck run").release()  # a live run there: refused, naming it
        raise UsageError(f"--out {target} already holds files", hint="choose a new folder, or use --resume to finish that run")
    lock = acquire_lock(target, "adaptcheck run")
    if _holds_files(target):  # checked again under the lock: another run may have begun in between
        lock.release()
        raise UsageError(f"--out {target} already holds files", hint="choose a new folder, or use --resume to finish that run")
    return target, lock


def _make_writable_dir(target: Path, given: bool) -> None:
    """Create the run folder, or refuse (usage error, exit 2) one that cannot hold a run:
    a path that is a file, under a file, or in a folder this user cannot write."""
    import os

    what = f"--out {target}" if given else f"the default run folder {target}"
    hint = ("choose a folder you can write with --out DIR" if given
            else "run from a folder you can write, or choose one with --out DIR")
    if target.exists() and not target.is_dir():
        raise UsageError(f"{what} is a file, not a folder", hint=hint)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # NotADirectoryError (a parent is a file), PermissionError, read-only file system …
        raise UsageError(f"cannot create {what}: {exc.strerror or exc}", hint=hint) from None
    if not os.access(target, os.R_OK | os.W_OK | os.X_OK):
        raise UsageError(f"cannot write to {what}: permission denied", hint=hint)


def _holds_files(folder: Path) -> bool:
    """Anything in the folder but a lock file (one left by a run killed before it wrote anything)."""
    return any(p.name != LOCK_FILE for p in folder.iterdir())


def start_run(opts: RunOptions, progress: Progress | None = None) -> tuple[RunResults, Path]:
    """Run a ladder from the start. Returns the results and the run folder."""
    # A bad baseline is a one-line error before anything runs or any folder is made.
    baseline_text = _baseline_text(opts.baseline, opts.allow_unverified) if opts.baseline is not None else None
    ladder = load_ladder(opts.ladder)
    steps = parse_steps(",".join(map(str, opts.steps)) if opts.steps else None, sorted({c.step for c in ladder.spec.checks}))
    backend, probe = select_backend(opts.device)
    deployment = _read_deployment(opts, backend, probe.device_count) if opts.serve is not None else None
    started = utcnow()
    run_id = f"{started.strftime('%Y%m%d-%H%M%S')}-{backend.name}-{secrets.token_hex(3)}"
    run_dir, lock = new_run_dir(opts.out, run_id)  # held until _continue ends (or this process does)
    meta = RunMeta(
        run_id=run_id, started_at=started, command=opts.command,
        ladder=LadderRef(id=ladder.spec.id, version=ladder.spec.version, source=ladder.source, sha256=ladder.sha256),
        seed=opts.seed, steps=steps, device=_device_ref(backend, 0, probe.device_count), op_provider=opts.ops,
        model=(deployment.model or None) if deployment is not None else opts.model,
        model_auto=_auto_now(opts.model or ladder.spec.model.name) if deployment is None else None,
        endpoint=opts.endpoint, endpoint_model=opts.endpoint_model,
        baseline=str(opts.baseline) if opts.baseline is not None else None,
        deployment=deployment, reference_memory=opts.reference_memory,
    )
    if baseline_text is not None:
        (run_dir / BASELINE).write_text(baseline_text, encoding="utf-8")
    (run_dir / LADDER_SNAPSHOT).write_text(ladder.text, encoding="utf-8")
    # run.json keeps no secret (URL credentials in --endpoint or the command line); the worker
    # gets the real endpoint through its init message, and a resume asks for it again.
    (run_dir / RUN_META).write_text(stored_meta(meta).model_dump_json(indent=2), encoding="utf-8")
    return _continue(run_dir, meta, ladder.spec, backend, progress, lock), run_dir


def _read_deployment(opts: RunOptions, backend: Backend, device_count: int) -> Deployment:
    """``--serve`` read by its engine's parser and checked against this machine, before any folder is
    made or anything runs (:class:`DeploymentError`, one line)."""
    from adaptcheck.frameworks.base import allowed_cores
    from adaptcheck.frameworks.deployment import check_fits, read_serve
    from adaptcheck.frameworks.registry import framework_class

    if opts.model is not None:
        raise UsageError("--model and --serve both name the model", hint="the model is the --serve command's: "
                         "leave --model out")
    if opts.endpoint is not None:
        raise UsageError("--endpoint and --serve both name the server under test",
                         hint="--serve starts the server itself: leave --endpoint out")
    deployment = read_serve(opts.serve or "")
    rank_env = framework_class("vllm").host_tensor_parallel_env if deployment.engine == "vllm" else None
    if deployment.engine == "vllm" and deployment.tensor_parallel_size > 1 and deployment.model:
        # vLLM refuses this only once the engine is configured, after the start-up's cost.
        unfit = framework_class("vllm").tensor_parallel_unfit(Path(deployment.model), deployment.tensor_parallel_size)
        if unfit is not None:
            from adaptcheck.frameworks.deployment import DeploymentError

            raise DeploymentError(f"--serve: {unfit}", hint="choose a --tensor-parallel-size that divides them")
    check_fits(deployment, device_type=backend.torch_device(0).type, device_count=device_count,
               host_rank_env=rank_env, cores=len(allowed_cores()))
    return deployment


def _baseline_text(path: Path, allow_unverified: bool = False) -> str:
    """The text of a ``--baseline`` file, once it is known to load as results and to be intact
    (an edited baseline could hide a regression): an edited or undigested file (schema 1.0
    has no digest) is refused with exit 5 unless ``allow_unverified``. The copy keeps the
    file's text byte for byte, so the perf.regression check verifies it again and its
    evidence says when the baseline was unverified."""
    from adaptcheck.base.trusted import load_verified

    load_verified(path, allow_unverified, role="--baseline: ")
    return path.read_text(encoding="utf-8")


def resume_run(run_dir: Path, progress: Progress | None = None,
               endpoint: str | None = None) -> tuple[RunResults, Path]:
    """Finish a run whose process was killed: skip checks already in the journal.

    Guarantees: the folder is locked before anything in it is read or run (a live run or a
    second resume is refused, exit 2); the stored ladder is the one the run started with
    (sha256 in run.json, else exit 5), and so is the model ``auto`` stands for (else exit 5);
    a journal line torn by the kill is set aside and its check runs again, so every check is
    in the results exactly once.
    """
    meta_path = run_dir / RUN_META
    if not meta_path.is_file():
        raise InvalidInputError(f"{run_dir}: not a run folder (no {RUN_META})", hint="pass the folder a run wrote")
    lock = acquire_lock(run_dir, "adaptcheck run --resume")
    try:
        try:
            meta = RunMeta.model_validate_json(meta_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise InvalidInputError(f"{meta_path}: unreadable run metadata: {exception_line(exc, with_type=False)}") from None
        # ``endpoint``: --endpoint given again (run.json keeps it without credentials).
        meta = meta.model_copy(update={"endpoint": resume_endpoint(meta.endpoint, endpoint)})
        spec = _stored_ladder(run_dir, meta)
        _same_auto_model(run_dir, meta)
        backend = get_backend(meta.device.backend)
        probe = backend.probe()
        if not probe.available:
            raise DeviceError(f"device {meta.device.backend!r} of this run is not available now: {probe.reason}")
    except BaseException:
        lock.release()
        raise
    return _continue(run_dir, meta, spec, backend, progress, lock), run_dir


def _auto_now(name: str) -> str | None:
    """What the model name ``auto`` stands for here and now (None for any other name)."""
    from adaptcheck.frameworks.modelsrc import AUTO_MODEL

    if name != AUTO_MODEL:
        return None
    from adaptcheck.frameworks.pretrained import auto_choice

    return auto_choice()[0]


def _same_auto_model(run_dir: Path, meta: RunMeta) -> None:
    """Refuse a resume where ``auto`` now stands for another model than when the run started.

    Every check resolves its model when it runs, so a pretrained package installed or removed
    between the kill and the resume would have the rest of the run certify another model than
    its first checks did, under one certificate.
    """
    if meta.model_auto is None:  # not an 'auto' run, or a run.json written before the field
        return
    now = _auto_now("auto")
    if now != meta.model_auto:
        raise IntegrityError(f"{run_dir} started with model 'auto' = {meta.model_auto}, and 'auto' stands for "
                             f"{now} here now",
                             hint=f"install what made 'auto' mean {meta.model_auto} again, or start a new run")


def _stored_ladder(run_dir: Path, meta: RunMeta) -> LadderSpec:
    """The run folder's ladder.yaml, once it is known to be the ladder the run started with.

    results.json claims run.json's ladder sha256; a resume from an edited copy would certify
    checks (or grade rules) that the claimed ladder does not have.
    """
    import hashlib

    path = run_dir / LADDER_SNAPSHOT
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidInputError(f"{run_dir}: no {LADDER_SNAPSHOT} (the ladder the run started with)",
                                hint="restore it from the run's ladder, or start a new run") from None
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != meta.ladder.sha256:
        raise IntegrityError(f"{LADDER_SNAPSHOT} in {run_dir} was edited after the run started "
                             f"(sha256 {actual[:12]}… ≠ {meta.ladder.sha256[:12]}… in {RUN_META})",
                             hint="restore the original ladder.yaml, or start a new run with the edited ladder")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # cannot happen for a file whose digest matched what the run wrote
        raise InvalidInputError(f"{path}: not UTF-8 text") from None
    return parse_ladder(text, str(path))


def _continue(run_dir: Path, meta: RunMeta, spec: LadderSpec, backend: Backend, progress: Progress | None,
              lock: RunLock) -> RunResults:
    """Run what the journal does not hold yet and write the outputs, with the folder's lock held
    (released on return or error; the kernel releases it if this process is killed)."""
    with lock:
        return _run_locked(run_dir, meta, spec, backend, progress)


def _run_locked(run_dir: Path, meta: RunMeta, spec: LadderSpec, backend: Backend,
                progress: Progress | None) -> RunResults:
    progress = progress or Progress()
    spec = with_run_model(spec, meta)
    journal = JournalWriter(run_dir / JOURNAL)
    repaired = journal.repair()  # a line torn by a kill must not swallow the next record
    if repaired is not None:
        progress.note(f"{JOURNAL}: {repaired.fragments} torn or unreadable line(s) set aside in "
                      f"{repaired.torn_path.name}; their checks run again")
    done = journal.read()
    selected = [c for c in spec.checks if c.step in meta.steps]
    progress.header(run_header(run_dir, meta, spec, selected, done))
    progress.planned(selected)
    todo = []
    for c in selected:
        if c.id in done:
            progress.finished(c, done[c.id])
        else:
            todo.append(PlannedRun(c, spec.timeout_for(c)))
    server = _start_deployed_server(meta, run_dir)
    endpoint = meta.endpoint if server is None else server.base_url
    init: WorkerInit = {"backend": backend.name, "device_index": meta.device_index, "seed": meta.seed,
            "run_dir": str(run_dir), "model": spec.model.model_dump(mode="json"),
            "device_count": meta.device.device_count, "op_provider": meta.op_provider,
            "endpoint": {"url": endpoint, "model": meta.endpoint_model,
                         "reference": meta.model is not None and bool(meta.model)}
            if endpoint else None,
            "deployment": meta.deployment.model_dump(mode="json") if meta.deployment is not None else None,
            "reference_memory": meta.reference_memory}
    try:
        execute(todo, init, journal, run_dir / WORKER_LOG, on_start=progress.started, on_done=progress.finished,
                on_progress=progress.progress)
    except KeyboardInterrupt:
        # Ctrl-C: still leave a readable (incomplete) results.json and report of what finished.
        write_outputs(assemble(meta, spec, journal.read(), complete=False), run_dir)
        raise
    finally:
        if server is not None:
            server.stop()
    results = assemble(meta, spec, journal.read(), complete=True)
    write_outputs(results, run_dir)
    return results


def _start_deployed_server(meta: RunMeta, run_dir: Path) -> ManagedServer | None:
    """A ``--serve`` command that is not vLLM's (SGLang, any OpenAI-compatible server): started as
    given for the whole run, and tested as the run's endpoint (step 4's endpoint checks, step 5).
    A command that exits during start-up is a one-line error quoting its last log line."""
    dep = meta.deployment
    if dep is None or not dep.given or dep.engine == "vllm":
        return None
    from adaptcheck.frameworks.server import ManagedServer, ServerSpec

    spec = ServerSpec(kind="command", model_path=Path(dep.model or "."), command=list(dep.command),
                      port=dep.port)
    server = ManagedServer(spec, run_dir / "framework")
    server.start()
    return server


def resume_endpoint(stored: str | None, given: str | None) -> str | None:
    """The endpoint a resumed run talks to: run.json's, or ``--endpoint`` given again.

    run.json keeps the endpoint redacted, so a run whose endpoint had credentials can be
    resumed only with ``--resume DIR --endpoint URL``; the URL must redact to the stored
    value (the same server), and the API key comes from ``$ADAPTCHECK_API_KEY`` as always.
    """
    from adaptcheck.base.redact import REDACTED, scrub_text, scrub_url_credentials

    if given is None:
        if stored is not None and REDACTED in stored:
            raise UsageError("this run's --endpoint had credentials, which run.json does not keep",
                             hint=f"give it again: adaptcheck run --resume DIR --endpoint URL (stored as {stored})")
        return stored
    if stored is None:
        raise UsageError("--endpoint: this run was started without an endpoint",
                         hint="resume without --endpoint, or start a new run")
    if given != stored and stored not in (scrub_text(given), scrub_url_credentials(given)):
        raise UsageError(f"--endpoint {scrub_text(given)} is not this run's endpoint ({stored})",
                         hint="give the URL the run was started with")
    return given
