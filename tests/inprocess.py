"""The CLI run inside the test process: argument and input errors without a new interpreter.

``invoke`` wraps :func:`adaptcheck.cli.app.main` — the entry point with the CLI's one error
path (exit codes, the one-line error) — in typer's ``CliRunner`` isolation (stdout, stderr
and environment swapped for the call), and returns what :func:`tests.conftest.run_cli`
returns. It is for commands that stop before any check runs (usage errors, bad files,
``grade``, ``schema``): a subprocess costs 2-5 s of imports each, and ``run_cli`` stays for
real runs, signals and anything that must start from a clean process.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence


def invoke(args: Sequence[str], *, env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """``adaptcheck ARGS`` in process: the exit code main() ends with, and what it printed."""
    from typer.testing import CliRunner

    from adaptcheck.cli.app import main

    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2 mixes them by default
    except TypeError:  # click >= 8.2 (and typer's own click) always keep stderr apart
        runner = CliRunner()
    code = 0
    with runner.isolation(env=env) as streams:
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = streams[0].getvalue(), streams[1].getvalue() if streams[1] is not None else b""
    return subprocess.CompletedProcess(["adaptcheck", *args], code, out.decode(), err.decode())
