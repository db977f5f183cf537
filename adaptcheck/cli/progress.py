"""What ``adaptcheck run`` shows on stderr while it runs.

A header (what runs, on what, where it goes, how long it should take), a progress bar with
the running check's own elapsed time and progress, and one line per finished result — with
repeated n/a and skip reasons folded into one line. Everything goes through the one Output
object, so secrets are scrubbed and terminal controls made inert.
"""

from __future__ import annotations

import time
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from adaptcheck.base.schemas.ladder import CheckSpec
from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.cli.output import STATUS_STYLE, Output
from adaptcheck.ladder.protocol import ProgressReport
from adaptcheck.session import Progress as RunProgress
from adaptcheck.session import RunHeader


class RichProgress(RunProgress):
    """On stderr: a header saying what runs where, a progress bar (with the running check's
    own elapsed time and progress), and one line per finished check — where many checks end
    n/a or skip for the same reason, the first is printed and the rest folded into one line."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), CheckColumn(), console=out.err, transient=True, disable=out.quiet)
        self.task = self.bar.add_task("starting", total=0, check_started=None, check_planned=None, check_progress="")
        self.started_at = 0.0
        self.folder = ReasonFolder(out)

    def header(self, header: RunHeader) -> None:
        steps = ",".join(str(s) for s in header.steps)
        self.out.info(f"adaptcheck run: {header.checks} checks of ladder {header.ladder}, steps {steps}")
        rows = [("device", header.device), ("model", header.model)]
        if header.deployment:
            rows.append(("deploys", header.deployment))
        if header.endpoint:
            rows.append(("endpoint", header.endpoint))
        rows.append(("output", str(header.run_dir)))
        if header.already_done:
            rows.append(("resuming", f"{header.already_done} of {header.checks} checks already done"))
        rows.append(("expected", header.expected))
        for name, value in rows:
            self.out.styled((f"  {name:<9}", "bold"), (value, None))

    def planned(self, checks: list[CheckSpec]) -> None:
        self.bar.update(self.task, total=len(checks))
        self.bar.start()

    def started(self, spec: CheckSpec) -> None:
        from adaptcheck.ladder.estimate import check_estimate

        self.started_at = time.perf_counter()
        seconds, stated = check_estimate(spec)
        self.bar.update(self.task, description=_esc(f"step {spec.step}: {spec.id}"), check_started=self.started_at,
                        check_planned=seconds if stated else None, check_progress="")

    def progress(self, spec: CheckSpec, report: ProgressReport) -> None:
        self.bar.update(self.task, check_progress=progress_text(report))

    def finished(self, spec: CheckSpec, results: list[CheckResult]) -> None:
        for r in results:
            self.folder.add(r)
        self.bar.update(self.task, check_started=None, check_progress="")
        self.bar.advance(self.task)

    def note(self, text: str) -> None:
        self.out.info(f"note: {text}", style="yellow")

    def stop(self) -> None:
        self.folder.flush()
        self.bar.stop()


FOLDED_LABELS = ("n/a", "skip")
"""Results folded when their reason repeats; a fail or error is always printed in full."""


class ReasonFolder:
    """Prints finished results, folding repeated n/a and skip reasons.

    The first result with a given reason is printed in full; the same reason again (keyed
    on the label and the message text) is counted, and one line "… and N more ops.vllm.* n/a
    for the same reason" is printed when a different result comes or the run ends.
    results.json keeps every message in full.
    """

    def __init__(self, out: Output) -> None:
        self.out = out
        self.first: dict[tuple[str, str], str] = {}  # reason -> id of the result printed in full
        # The reason being folded, the ids folded so far, and whether they directly follow the
        # result printed in full (else the folded line points back at it).
        self.pending: tuple[tuple[str, str], list[str], bool] | None = None

    def add(self, r: CheckResult) -> None:
        key = (r.label, r.message)
        if r.label in FOLDED_LABELS and r.message:
            if self.pending is not None and self.pending[0] == key:
                self.pending[1].append(r.id)
                return
            self.flush()
            if key in self.first:
                self.pending = (key, [r.id], False)
                return
            self.first[key] = r.id
            self.pending = (key, [], True)
        else:
            self.flush()
        self._print(r)

    def _print(self, r: CheckResult) -> None:
        msg = f" — {r.message}" if r.message and r.status is not Status.PASS else ""
        # Through Output (the bar's own console): scrubbed, terminal controls made inert.
        self.out.styled((f"{r.label:>5}", STATUS_STYLE.get(r.label)), (f" {r.id} ({r.duration_s:.2f}s){msg}", None))

    def flush(self) -> None:
        """Print the folded line of the reason being folded, if any result was folded."""
        if self.pending is None:
            return
        key, ids, consecutive = self.pending
        self.pending = None
        if not ids:
            return
        label = key[0]
        where = "" if consecutive else f" as {self.first[key]} above"
        self.out.styled((f"{'…':>5}", STATUS_STYLE.get(label)),
                        (f" and {len(ids)} more {id_pattern(ids)} {label} for the same reason{where}", None))


def id_pattern(ids: list[str]) -> str:
    """The ids' common dotted prefix as a glob ('ops.vllm.*'); the id itself for one."""
    if len(ids) == 1:
        return ids[0]
    parts = [i.split(".") for i in ids]
    common: list[str] = []
    for segment in zip(*parts, strict=False):
        if len(set(segment)) != 1:
            break
        common.append(segment[0])
    return ".".join(common) + ".*" if common else "checks"


def progress_text(report: ProgressReport) -> str:
    """A progress message as shown after the bar: '133/300 s soak', '2/6 runs · concurrency 4, run 3/3'."""
    done: Any = report.get("done")
    total: Any = report.get("total")
    unit, note = report.get("unit") or "", report.get("note") or ""
    try:
        amount = f"{float(done):g}" if total is None else f"{float(done):g}/{float(total):g}"
        if unit == "s":
            amount = f"{float(done):.0f}" + ("" if total is None else f"/{float(total):.0f}")
    except (TypeError, ValueError):
        return ""
    text = f"{amount} {unit}".strip()
    return _esc(f"{text} · {note}" if note else text)


def clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class CheckColumn(ProgressColumn):
    """The running check's own elapsed time (against its planned time when the ladder states
    one, e.g. a soak's duration) and its latest progress message."""

    def render(self, task: Task) -> Text:
        started = task.fields.get("check_started")
        if not started:
            return Text("")
        elapsed = clock(time.perf_counter() - started)
        planned = task.fields.get("check_planned")
        head = f"check {elapsed}" + (f" / {clock(planned)}" if planned else "")
        detail = task.fields.get("check_progress") or ""
        return Text.from_markup(f"[cyan]{head}[/]" + (f" · {detail}" if detail else ""))


def _esc(text: str) -> str:
    """Text for rich markup (the bar's description): secrets scrubbed, controls inert, markup escaped."""
    from rich.markup import escape

    from adaptcheck.cli.output import shown

    return escape(shown(text, newlines=False))
