"""The ``adaptcheck`` Typer application and the error → exit-code mapping.

Every command lives in its own small module; this one wires them together and owns the
single place where exceptions become one-line messages and documented exit codes
(README, "Exit codes").
"""

from __future__ import annotations

import sys

import typer

from adaptcheck import __version__
from adaptcheck.cli import (
    cmd_backends,
    cmd_cluster,
    cmd_compare,
    cmd_env,
    cmd_frameworks,
    cmd_grade,
    cmd_kinds,
    cmd_matrix,
    cmd_ops,
    cmd_report,
    cmd_run,
    cmd_schema,
    cmd_verify,
)
from adaptcheck.cli.output import Output
from adaptcheck.errors import AdaptcheckError, ExitCode

app = typer.Typer(
    name="adaptcheck",
    help="Validate and certify this machine for LLM inference (grade L1-L5 with evidence).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

app.command("run")(cmd_run.run)
app.command("grade")(cmd_grade.grade)
app.command("compare")(cmd_compare.compare)
app.command("report")(cmd_report.report)
app.command("env")(cmd_env.env)
app.command("backends")(cmd_backends.backends)
app.command("kinds")(cmd_kinds.kinds)
app.command("ops")(cmd_ops.ops)
app.command("frameworks")(cmd_frameworks.frameworks)
app.command("schema")(cmd_schema.schema)
app.add_typer(cmd_matrix.app, name="matrix")
app.add_typer(cmd_cluster.app, name="cluster")
app.command("verify")(cmd_verify.verify)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"adaptcheck {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Validate and certify this machine for LLM inference."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, map errors to one line + exit code."""
    try:
        # With standalone_mode=False, click turns Ctrl-C into a returned 130 and typer.Exit
        # into its returned code instead of raising.
        code = app(args=argv, standalone_mode=False)
        if code == ExitCode.INTERRUPTED:
            raise KeyboardInterrupt
        if isinstance(code, int) and code:
            sys.exit(code)
    except AdaptcheckError as exc:
        Output().error(exc.one_line())
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        Output().error("interrupted; finished checks are kept in the run folder (resume with --resume DIR)")
        sys.exit(int(ExitCode.INTERRUPTED))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(int(ExitCode.INTERRUPTED))
    except Exception as exc:  # click usage errors and genuine bugs
        import click

        if isinstance(exc, click.exceptions.ClickException):
            Output().error(exc.format_message().replace("\n", " "))
            sys.exit(int(ExitCode.USAGE))
        Output().error(f"internal error ({type(exc).__name__}: {exc}); please report it with the run folder")
        sys.exit(int(ExitCode.INTERNAL))
    sys.exit(0)
