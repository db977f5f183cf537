"""``adaptcheck run``: run the ladder on this machine, show progress (:mod:`adaptcheck.cli.progress`), print the grade."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from adaptcheck.base.errors import GradeBelowRequired
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.base.units import memory_size
from adaptcheck.cli.output import Format, Output
from adaptcheck.cli.progress import RichProgress
from adaptcheck.cli.render import print_grade, print_summary
from adaptcheck.grade import level_at_least
from adaptcheck.report import details_path
from adaptcheck.runfolder import REPORT, RESULTS
from adaptcheck.session import RunOptions, parse_steps, resume_run, start_run


def run(
    device: str | None = typer.Option(None, "--device", "-d", help="Backend to test (see 'adaptcheck backends'); default: the one available accelerator, else cpu."),
    ladder: str = typer.Option("standard", "--ladder", "-l", help="Built-in ladder name (quick, standard) or a YAML path."),
    steps: str | None = typer.Option(None, "--steps", help="Run only these steps, e.g. '1,2' or '2-3' (the grade names the others as not run)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Run folder (default: reports/<run id>/)."),
    seed: int = typer.Option(0, "--seed", help="Seed for every generated input, and for the embedded model's weights (each seed is a different random model)."),
    ops: str | None = typer.Option(None, "--ops", help="Op provider for step 3 (name or 'module:object'), instead of the ladder's."),
    model: str | None = typer.Option(None, "--model", "-m", help="Model for steps 1 and 4-5 instead of the ladder's: 'auto' (the first installed pretrained model, else embedded:tiny-llama), 'pretrained:NAME', 'embedded:NAME', a local Hugging Face folder or a .gguf file (never downloaded)."),
    endpoint: str | None = typer.Option(None, "--endpoint", help="Also test this OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1); API key from $ADAPTCHECK_API_KEY or $OPENAI_API_KEY."),
    serve: str | None = typer.Option(None, "--serve", help="The command you deploy, quoted as one argument: 'vllm serve MODEL --tensor-parallel-size 8 --max-model-len 32768 …' (or with vLLM's --config serve.yaml; or 'python -m sglang.launch_server …', or any OpenAI-compatible server command with --port N). Read by the installed engine's own parser; steps 4 and 5 run exactly it (docs/deployment.md)."),
    reference_memory: str | None = typer.Option(None, "--reference-memory", help="Most memory the CPU float64 reference may hold, e.g. 400MB or 64GiB (default: half of the host's free memory); past it the reference streams the weights a decoder layer at a time."),
    endpoint_model: str | None = typer.Option(None, "--endpoint-model", help="Served model name to request from --endpoint (default: the first it lists)."),
    baseline: Path | None = typer.Option(None, "--baseline", help="results.json of an earlier run of this machine: the ladder's perf.regression check compares this run against it (copied into the run folder). Refused (exit 5) when edited after its run or without digest, unless --allow-unverified."),
    allow_unverified: bool = typer.Option(False, "--allow-unverified", help="Use a --baseline edited after its run or without digest; the perf.regression evidence then says the baseline was unverified."),
    resume: Path | None = typer.Option(None, "--resume", help="Finish an interrupted run in this folder (other options are taken from it; give --endpoint again when its URL had credentials)."),
    require: str | None = typer.Option(None, "--require", help="Exit 1 unless the grade is at least this level (L1-L5)."),
    junit: Path | None = typer.Option(None, "--junit", help="Also write JUnit XML (one test case per check, plus 'grade') to this path, for CI."),
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
            # --endpoint with --resume: the URL again, credentials included (run.json keeps none).
            results, run_dir = resume_run(resume, progress, endpoint=endpoint)
        else:
            opts = RunOptions(ladder=ladder, device=device, steps=parse_steps(steps, [1, 2, 3, 4, 5]) if steps is not None else None,
                              out=out, seed=seed, ops=ops, model=model, endpoint=endpoint, endpoint_model=endpoint_model,
                              baseline=baseline, allow_unverified=allow_unverified,
                              command=["adaptcheck", *sys.argv[1:]], serve=serve,
                              reference_memory=memory_size(reference_memory, "--reference-memory")
                              if reference_memory is not None else None)
            results, run_dir = start_run(opts, progress)
    finally:
        progress.stop()
    print_summary(output, results)
    print_grade(output, results)
    output.info(f"results: {run_dir / RESULTS}")
    output.info(f"report:  {run_dir / REPORT}")
    output.info(f"details: {details_path(run_dir / REPORT)}")
    saved = RunResults.load(run_dir / RESULTS)  # what was written: scrubbed, and sealed with its digest
    if junit is not None:
        from adaptcheck.report.junit import write_junit

        write_junit(saved, junit, require)  # also when below --require: CI wants to see why
        output.info(f"junit:   {junit}")
    output.data(saved.model_dump(mode="json"))
    if require is not None and not level_at_least(results.grade.level, require):
        raise GradeBelowRequired(f"grade {results.grade.level} is below the required {require}")
