"""``adaptcheck run``: run the ladder on this machine, show progress, print the grade."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from adaptcheck.cli.output import STATUS_STYLE, Format, Output
from adaptcheck.cli.render import print_grade, print_summary
from adaptcheck.errors import GradeBelowRequired
from adaptcheck.models.ladder import CheckSpec
from adaptcheck.models.results import CheckResult, RunResults, Status
from adaptcheck.session import RESULTS, REPORT, Progress as RunProgress, RunOptions, parse_steps, resume_run, start_run
from adaptcheck.steps.grade import level_at_least


class RichProgress(RunProgress):
    """A progress bar plus one line per finished check, on stderr."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=out.err, transient=True, disable=out.quiet)
        self.task = self.bar.add_task("starting", total=0)
        self.started_at = 0.0

    def planned(self, checks: list[CheckSpec]) -> None:
        self.bar.update(self.task, total=len(checks))
        self.bar.start()

    def started(self, spec: CheckSpec) -> None:
        self.started_at = time.perf_counter()
        self.bar.update(self.task, description=f"step {spec.step}: {spec.id}")

    def finished(self, spec: CheckSpec, results: list[CheckResult]) -> None:
        for r in results:
            label = "n/a" if (r.status is Status.SKIP and not r.applicable) else r.status.value
            style = STATUS_STYLE.get(label, "")
            msg = f" — {r.message}" if r.message and r.status is not Status.PASS else ""
            if not self.out.quiet:
                self.bar.console.print(f"[{style}]{label:>5}[/] {r.id} ({r.duration_s:.2f}s){_esc(msg)}", soft_wrap=True)
        self.bar.advance(self.task)

    def stop(self) -> None:
        self.bar.stop()


def _esc(text: str) -> str:
    from rich.markup import escape

    from adaptcheck.steps.matrix.redact import scrub_text

    return escape(scrub_text(text))


def run(
    device: Optional[str] = typer.Option(None, "--device", "-d", help="Backend to test (see 'adaptcheck backends'); default: the one available accelerator, else cpu."),
    ladder: str = typer.Option("standard", "--ladder", "-l", help="Built-in ladder name (quick, standard) or a YAML path."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Run only these steps, e.g. '1,2' or '2-3' (the grade names the others as not run)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run folder (default: reports/<run id>/)."),
    seed: int = typer.Option(0, "--seed", help="Seed for every generated input."),
    ops: Optional[str] = typer.Option(None, "--ops", help="Op provider for step 3 (name or 'module:object'), instead of the ladder's."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model for steps 1 and 4-5 instead of the ladder's: a local Hugging Face folder or 'embedded:NAME' (never downloaded)."),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="Also test this OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1); API key from $ADAPTCHECK_API_KEY or $OPENAI_API_KEY."),
    endpoint_model: Optional[str] = typer.Option(None, "--endpoint-model", help="Served model name to request from --endpoint (default: the first it lists)."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="results.json of an earlier run of this machine: the ladder's perf.regression check compares this run against it (copied into the run folder)."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Finish an interrupted run in this folder (other options are taken from it)."),
    require: Optional[str] = typer.Option(None, "--require", help="Exit 1 unless the grade is at least this level (L1-L5)."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Also write JUnit XML (one test case per check, plus 'grade') to this path, for CI."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table (human, stderr) or json/yaml (results on stdout)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress or tables on stderr."),
) -> None:
    """Run the certification ladder on this machine and write results.json + report.html."""
    from adaptcheck.cli.cmd_grade import check_level

    if require is not None:
        check_level(require)
    if ops is not None:
        from adaptcheck.steps.ops.providers.registry import load_provider

        load_provider(ops)  # fail fast, with the one-line reason, before any check runs
    output = Output(fmt, quiet)
    progress = RichProgress(output)
    try:
        if resume is not None:
            results, run_dir = resume_run(resume, progress)
        else:
            opts = RunOptions(ladder=ladder, device=device, steps=parse_steps(steps, [1, 2, 3, 4, 5]) if steps else None,
                              out=out, seed=seed, ops=ops, model=model, endpoint=endpoint, endpoint_model=endpoint_model,
                              baseline=baseline, command=["adaptcheck", *sys.argv[1:]])
            results, run_dir = start_run(opts, progress)
    finally:
        progress.stop()
    print_summary(output, results)
    print_grade(output, results)
    output.info(f"results: {run_dir / RESULTS}")
    output.info(f"report:  {run_dir / REPORT}")
    saved = RunResults.load(run_dir / RESULTS)  # what was written: scrubbed, and sealed with its digest
    if junit is not None:
        from adaptcheck.report.junit import write_junit

        write_junit(saved, junit, require)  # also when below --require: CI wants to see why
        output.info(f"junit:   {junit}")
    output.data(saved.model_dump(mode="json"))
    if require is not None and not level_at_least(results.grade.level, require):
        raise GradeBelowRequired(f"grade {results.grade.level} is below the required {require}")
