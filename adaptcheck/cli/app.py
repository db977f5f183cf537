"""The ``adaptcheck`` Typer application and the error → exit-code mapping.

Every command lives in its own small module; this one wires them together and owns the
single place where exceptions become one-line messages and documented exit codes
(README, "Exit codes").
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

from adaptcheck import __version__
from adaptcheck.base.errors import AdaptcheckError, ExitCode
from adaptcheck.cli import (
    cmd_backends,
    cmd_cluster,
    cmd_compare,
    cmd_env,
    cmd_frameworks,
    cmd_grade,
    cmd_kinds,
    cmd_ladder,
    cmd_matrix,
    cmd_ops,
    cmd_report,
    cmd_repro,
    cmd_run,
    cmd_schema,
    cmd_verify,
)
from adaptcheck.cli.output import Output

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
app.add_typer(cmd_ladder.app, name="ladder")
app.add_typer(cmd_matrix.app, name="matrix")
app.add_typer(cmd_cluster.app, name="cluster")
app.command("verify")(cmd_verify.verify)
app.command("repro")(cmd_repro.repro)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"adaptcheck {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Validate and certify this machine for LLM inference."""


def _click_exception_classes() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...],
                                        tuple[type[BaseException], ...]]:
    """(ClickException, Exit, Abort) classes of every click that may be in use.

    typer 0.29 and later vendor their own click as ``typer._click`` (its exceptions are not
    ``click``'s); typer 0.12-0.28 use the ``click`` package. Plain click is only looked up if
    it is already imported: if nothing imported it, nothing can raise its exceptions.
    """
    click_exc: list[type[BaseException]] = []
    exits: list[type[BaseException]] = [typer.Exit]
    aborts: list[type[BaseException]] = [typer.Abort]
    modules = []
    try:
        import typer._click.exceptions as vendored  # type: ignore[import-not-found,unused-ignore]

        modules.append(vendored)
    except ImportError:
        pass
    if "click.exceptions" in sys.modules:
        modules.append(sys.modules["click.exceptions"])
    for module in modules:
        for name, into in (("ClickException", click_exc), ("Exit", exits), ("Abort", aborts)):
            cls = getattr(module, name, None)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                into.append(cls)
    return tuple(click_exc), tuple(exits), tuple(aborts)


def _is_click_error(exc: BaseException, classes: tuple[type[BaseException], ...]) -> bool:
    """A command-line parsing error of click or typer (also of a click we do not know yet:
    anything from a click/typer module that carries ``exit_code`` and ``format_message``)."""
    if isinstance(exc, classes):
        return True
    module = type(exc).__module__ or ""
    return (module.split(".")[0] in ("click", "typer") and isinstance(getattr(exc, "exit_code", None), int)
            and callable(getattr(exc, "format_message", None)))


def _usage_line(exc: BaseException) -> str:
    """click's message on one line, with where to find the command's help."""
    message = str(exc.format_message()).replace("\n", " ").strip()  # type: ignore[attr-defined]
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "command_path", None)
    return f"{message} (see '{command} --help')" if isinstance(command, str) and command else message


def _interrupted() -> NoReturn:
    Output().error("interrupted; finished checks are kept in the run folder (resume with --resume DIR)")
    sys.exit(int(ExitCode.INTERRUPTED))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, map errors to one line + exit code.

    The one error path of the CLI: an :class:`AdaptcheckError` exits with its own code, a
    click/typer usage error with 2 (usage), Ctrl-C with 130. Anything else is a bug: exit 70.
    """
    try:
        # With standalone_mode=False, click turns typer.Exit into its returned code instead of
        # raising; typer >= 0.29 also returns 130 for Ctrl-C, older click raises Abort.
        # prog_name: messages say "adaptcheck …" also under "python -m adaptcheck" or in tests.
        code = app(args=argv, prog_name="adaptcheck", standalone_mode=False)
        if code == ExitCode.INTERRUPTED:
            raise KeyboardInterrupt
        if isinstance(code, int) and code:
            sys.exit(code)
    except AdaptcheckError as exc:
        Output().error(exc.one_line())
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        _interrupted()
    except Exception as exc:  # noqa: BLE001 - click usage errors, Exit/Abort of either click, and genuine bugs
        # Looked up now, not at start: a command may be what imported the click package.
        click_errors, exits, aborts = _click_exception_classes()
        if isinstance(exc, exits):
            sys.exit(int(getattr(exc, "exit_code", 0) or 0))
        if isinstance(exc, aborts):
            _interrupted()  # older click turns Ctrl-C into Abort
        if type(exc).__name__ == "NoArgsIsHelpError" and _is_click_error(exc, click_errors):
            # 'adaptcheck' or 'adaptcheck matrix' alone: the help (typer's rich help is already
            # printed and the message is empty; plain click's message is the help text), exit 2.
            help_text = str(exc.format_message())  # type: ignore[attr-defined]
            if help_text.strip():
                sys.stderr.write(help_text.rstrip("\n") + "\n")
            sys.exit(int(ExitCode.USAGE))
        if _is_click_error(exc, click_errors):
            Output().error(_usage_line(exc))
            sys.exit(int(ExitCode.USAGE))
        Output().error(f"internal error ({type(exc).__name__}: {exc}); please report it with the run folder")
        sys.exit(int(ExitCode.INTERNAL))
    sys.exit(0)
