"""The one exception hierarchy of adaptcheck and its mapping to exit codes.

Every error a user can cause or meet derives from :class:`AdaptcheckError`; the CLI turns
it into a single line on stderr and the exit code below (``adaptcheck.cli.app.main``, the
one error path; a command-line parsing error of click/typer is a usage error, 2). Anything
else escaping is a bug and is reported as such (exit code 70); docs/bad-inputs.md lists the
mistakes tried and the code each gets.
"""

from __future__ import annotations

import re
from enum import IntEnum

from adaptcheck.base.modules import module_present


class ExitCode(IntEnum):
    """Documented exit codes (README, "Exit codes")."""

    OK = 0
    GRADE_BELOW_REQUIRED = 1
    USAGE = 2
    INVALID_INPUT = 3
    DEVICE = 4
    INTEGRITY = 5
    CLUSTER_RENDEZVOUS = 6
    CLUSTER_PEER_LOST = 7
    INTERNAL = 70
    INTERRUPTED = 130


class AdaptcheckError(Exception):
    """Base of every error shown to the user as one line."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        """The message and the fix, on one line."""
        text = self.message.replace("\n", " ")
        return f"{text} ({self.hint})" if self.hint else text


class UsageError(AdaptcheckError):
    """A command-line value is wrong: unknown step, ladder name, option combination."""

    exit_code = ExitCode.USAGE


class InvalidInputError(AdaptcheckError):
    """A file given to adaptcheck cannot be used: malformed YAML, invalid ladder or results."""

    exit_code = ExitCode.INVALID_INPUT


class LadderError(InvalidInputError):
    """A ladder definition is malformed; the message names the file and line."""


class OutputError(UsageError):
    """An output path cannot be written (a folder, under a file, no permission, disk full):
    the user chooses output paths, so this is theirs to fix, not a bug."""


class UnknownNameError(UsageError):
    """A name (check kind, backend, ladder, op) is not known; the message lists the choices."""


class DeviceError(AdaptcheckError):
    """The requested device cannot be used, or the choice is ambiguous."""

    exit_code = ExitCode.DEVICE


class IntegrityError(AdaptcheckError):
    """A results file was edited after the run, or carries no digest to prove it was not."""

    exit_code = ExitCode.INTEGRITY


class GradeBelowRequired(AdaptcheckError):
    """The grade is lower than ``--require``."""

    exit_code = ExitCode.GRADE_BELOW_REQUIRED


# Framework adapters and the OpenAI client raise these; they are results for a check to
# report (a 'skip' for FrameworkUnavailable), not user errors with an exit code. They live
# here, in the base layer, because both frameworks/ and openai_client/ (below it) need them.


class FrameworkError(Exception):
    """A framework could not do what was asked; the message is one line for the report."""


class FrameworkUnavailable(FrameworkError):
    """The framework is not installed or cannot run here (a ``skip``, not a failure)."""


class ScoringUnsupported(FrameworkError):
    """This framework (or server) cannot score a given token sequence; the message says why.

    Step 4 then falls back to comparing greedy answers and says so in the evidence."""


def did_you_mean(name: str, choices: list[str] | tuple[str, ...]) -> str:
    """A short "did you mean" suffix listing the closest valid choices, or all of them."""
    import difflib

    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "valid choices: " + ", ".join(sorted(choices))


def _validation_error(exc: BaseException) -> str | None:
    """A pydantic-style validation error (a library's config model refusing a value) as
    ``Model.field = value: message``: the value first, so a cut line still names it."""
    errors = getattr(exc, "errors", None)
    title = getattr(exc, "title", None)
    if not callable(errors) or not isinstance(title, str):
        return None
    try:
        first = errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        msg = " ".join(str(first.get("msg", "")).split())
        value = repr(first.get("input"))
        # A model-level check (no field: vLLM's VllmConfig refusing a combination) has the whole
        # config as its input: the message is what says why, and a long value would push it out.
        if not where or len(value) > 80:
            return f"{title}{'.' + where if where else ''}: {msg}"
        return f"{title}.{where} = {value}: {msg}"
    except Exception:  # noqa: BLE001 - any other shape: the plain first line
        return None


def exception_line(exc: BaseException, limit: int = 300, *, with_type: bool = True) -> str:
    """An exception as one line for a message: ``Type: first line`` (whitespace collapsed),
    cut at ``limit`` characters; the type alone when neither it nor its cause has any text.

    The first *non-empty* line: transformers' "requires the PIL library" ImportError starts with
    a newline, and a plain ``str(exc).splitlines()[0]`` turned it into "ImportError: " (issue 39).
    An exception with no text of its own (``raise X from cause``) says its cause's line."""
    text = _first_line(str(exc))
    first_error = _validation_error(exc)
    if first_error:  # pydantic's first line is only "1 validation error for X": say which field, what value
        text = first_error
    if not text:
        cause = exc.__cause__ or exc.__context__
        if cause is not None and cause is not exc:
            text = exception_line(cause, limit)
        elif isinstance(exc, ImportError) and exc.name:
            text = f"No module named {exc.name!r}"
    if not with_type:
        return (text or type(exc).__name__)[:limit]
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:limit]


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return " ".join(line.split())
    return ""


_PIP_INSTALL = re.compile(r"pip install ([A-Za-z0-9_.\-\[\]]+(?: [A-Za-z0-9_.\-\[\]]+)*)")


def missing_dependency(exc: BaseException) -> str | None:
    """Where ``exc`` (or its cause) says an optional package is missing: one line naming it and
    the pip command that installs it; None for any other failure.

    Library messages name the command themselves ("… requires the PIL library … `pip install
    pillow`"); a bare ``ModuleNotFoundError`` names the module, which is its package name for
    the optional dependencies adaptcheck's checks reach (the pip name is then the module's)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ImportError):
            found = _PIP_INSTALL.search(str(cur))
            if found:
                sentence = _first_line(str(cur)).split(". ")[0].rstrip(".:")  # its first sentence says what
                return f"{sentence} (pip install {found.group(1).strip('`')})"
            if isinstance(cur, ModuleNotFoundError) and cur.name:
                top = cur.name.split(".")[0]
                if module_present(top):  # a package that is there but broken (vllm._C missing): not optional, a defect
                    return None
                return f"the optional package {top!r} is not installed (pip install {_PIP_NAMES.get(top, top)})"
        cur = cur.__cause__ or cur.__context__
    return None


_PIP_NAMES = {"PIL": "pillow", "yaml": "pyyaml", "sklearn": "scikit-learn", "cv2": "opencv-python-headless"}
"""Modules whose pip package has another name."""
