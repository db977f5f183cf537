"""Every row of docs/bad-inputs.md, run: each mistake is one line and its documented exit code.

The table in the doc is the test's data (parsed between its ``bad-inputs`` markers), so the
doc and the suite cannot drift. Most rows run in-process through ``adaptcheck.cli.app.main``
(fast); rows marked ``subprocess``/``both`` also run the installed console script, which
proves the entry point users call. No row may exit 70 ("internal error"): that code is for
bugs only.

The error path must work with the click that typer really uses — typer >= 0.29 bundles its
own (``typer._click``), older typer uses the ``click`` package — so the last tests here raise
each click's exceptions directly; ``scripts/test-oldest-cli.sh`` runs this file again under
the oldest supported typer.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

from adaptcheck.base.errors import ExitCode
from adaptcheck.cli import app as cli_app
from tests.inprocess import invoke

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "bad-inputs.md"
GOOD_SOURCE = ROOT / "tests" / "compare" / "data" / "baseline.json"
HELP_FRAGMENT = "Usage: adaptcheck"
RUN_MODES = {"in-process", "subprocess", "both"}

# Cases named in issue 12 ("Usage errors reported as bugs", "Wrong without a crash"): the
# table must keep a row for each.
ISSUE_CASES = {
    "format-choice", "unknown-option", "unknown-command", "seed-not-int", "verify-no-arg", "grade-no-arg",
    "compare-no-arg", "report-no-arg", "merge-no-arg", "out-is-file", "out-read-only", "cwd-read-only",
    "results-deep-grade", "results-digits-grade", "resume-no-ladder", "merge-keeps-good", "steps-backwards",
    "steps-empty", "steps-commas", "ladder-alias-bomb", "ladder-dup-id", "ladder-deep",
    "grade-edited", "report-edited", "compare-edited", "merge-edited", "terminal-escapes-grade",
    "terminal-escapes-compare", "resume-edited-ladder", "resume-torn-journal", "resume-twice", "resume-while-alive",
    "secrets-in-run-folder",
}


@dataclass(frozen=True)
class Row:
    """One row of the table."""

    id: str
    what: str
    args: list[str] | None  # None: a row covered by a named test elsewhere
    setups: tuple[str, ...]
    exit: int
    exit_old_click: int | None  # "2 (click < 8.2: 0)"
    fragment: str
    run: str

    @property
    def covered_by(self) -> str | None:
        """``FILE::TEST`` for a row that a dedicated test runs (it needs a live process or a whole run)."""
        return self.run.removeprefix("covered:").strip() if self.run.startswith("covered:") else None


def _cell(text: str) -> str:
    text = text.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == "`" else text


def read_rows(doc: Path = DOC) -> list[Row]:
    """The table between the markers of docs/bad-inputs.md."""
    text = doc.read_text(encoding="utf-8")
    body = text.split("<!-- bad-inputs:begin -->", 1)[1].split("<!-- bad-inputs:end -->", 1)[0]
    lines = [ln for ln in body.strip().splitlines() if ln.startswith("|")]
    rows = []
    for line in lines[2:]:  # header and separator
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 7, f"docs/bad-inputs.md: row needs 7 cells: {line}"
        rid, what, command, setup, exit_text, fragment, run = cells
        m = re.fullmatch(r"(\d+)(?: \(click < 8\.2: (\d+)\))?", exit_text)
        assert m, f"docs/bad-inputs.md: row {rid}: bad exit cell {exit_text!r}"
        command = _cell(command)
        args = shlex.split(command)[1:] if command else None
        assert args is None or shlex.split(command)[0] == "adaptcheck", f"row {rid}: command must start with adaptcheck"
        rows.append(Row(id=rid, what=what, args=args, setups=tuple(s.strip() for s in setup.split(",") if s.strip()),
                        exit=int(m.group(1)), exit_old_click=int(m.group(2)) if m.group(2) else None,
                        fragment=_cell(fragment), run=run))
    return rows


# --- setups -----------------------------------------------------------------------------

Setup = Callable[[Path, pytest.MonkeyPatch], None]


def _afile(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "afile").write_text("not a folder\n")


def _read_only_out(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    ro = tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:  # root writes anyway: make the access check answer as for a user
        real_access = os.access
        target = ro.resolve()

        def access(path: object, mode: int, *a: object, **kw: object) -> bool:
            if Path(str(path)).resolve() == target and mode & os.W_OK:
                return False
            return real_access(path, mode, *a, **kw)  # type: ignore[arg-type]

        mp.setattr(os, "access", access)


def _read_only_cwd(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    cwd = tmp / "rocwd"
    cwd.mkdir()
    cwd.chmod(0o555)
    mp.chdir(cwd)
    if os.geteuid() == 0:  # root writes anyway: fail creating reports/ as a user's mkdir would
        real_mkdir = Path.mkdir
        reports = (cwd / "reports").resolve()

        def mkdir(self: Path, *a: object, **kw: object) -> None:
            p = self.resolve()
            if p == reports or reports in p.parents:
                raise PermissionError(13, "Permission denied", str(self))
            real_mkdir(self, *a, **kw)  # type: ignore[arg-type]

        mp.setattr(Path, "mkdir", mkdir)


def _good_json(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    from adaptcheck.base.schemas.results import RunResults

    RunResults.load(GOOD_SOURCE).save(tmp / "good.json")  # sealed with its digest


def _deep_json(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    n = 100_000
    (tmp / "deep.json").write_text('{"schema_version": "1.1", "x": ' + "[" * n + "]" * n + "}")


def _digits_json(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "digits.json").write_text('{"schema_version": "1.1", "seed": ' + "7" * 100_000 + "}")


def _huge_json(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    with open(tmp / "huge.json", "wb") as f:
        f.truncate(65 * 1024 * 1024)  # sparse: cheap to make, refused before it is read


def _bad_json(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "bad.json").write_text('{"schema_version": "1.1", "run_id": ')


def _not_utf8_json(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "latin1.json").write_bytes('{"device": "Zürich"}'.encode("latin-1"))


def _deep_ladder(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    n = 100_000
    (tmp / "deep.yaml").write_text("checks: " + "[" * n + "]" * n + "\n")


BOMB = """a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def _bomb_ladder(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "bomb.yaml").write_text(BOMB)


def _digits_ladder(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "digits.yaml").write_text("schema_version: " + "1" * 100_000 + "\n")


def _huge_ladder(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "huge.yaml").write_text("# " + "x" * (5 * 1024 * 1024) + "\n")


DUP_LADDER = """schema_version: 1
id: dup
version: '0'
defaults:
  timeout_s: 60
checks:
- id: a
  step: 2
  kind: smoke.device_visible
- id: a
  step: 2
  kind: smoke.roundtrip
grade:
  levels:
    - level: L1
      name: device usable
      conditions:
        - id: first
          description: the first check passes
          checks: [a]
"""


def _dup_ladder(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    assert DUP_LADDER.splitlines()[9] == "- id: a"  # line 10: the row's expected line
    (tmp / "dup.yaml").write_text(DUP_LADDER)


def _typo_child_ladder(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "typo.yaml").write_text("schema_version: 1\nextends: standard\nid: mine\nchecks:\n"
                                   "  smoke.matmull: {params: {max_n: 64}}\n")


def _cycle_ladders(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "a.yaml").write_text("schema_version: 1\nextends: b.yaml\nid: a\n")
    (tmp / "b.yaml").write_text("schema_version: 1\nextends: a.yaml\nid: b\n")


def _orphan_ladder(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "orphan.yaml").write_text("schema_version: 1\nextends: base.yaml\nid: orphan\n")


def _run_without_ladder(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    from adaptcheck.base.schemas.results import DeviceRef, LadderRef, utcnow
    from adaptcheck.runfolder import RUN_META, RunMeta

    run = tmp / "run1"
    run.mkdir()
    meta = RunMeta(run_id="r1", started_at=utcnow(), command=["adaptcheck", "run"],
                   ladder=LadderRef(id="quick", version="1", source="builtin:quick", sha256="0" * 64),
                   seed=0, steps=[1], device=DeviceRef(backend="cpu", display_name="CPU", torch_device="cpu",
                                                        device_name="cpu", device_count=1))
    (run / RUN_META).write_text(meta.model_dump_json(indent=2))


def _sealed_variant(tmp: Path, name: str, edit: Callable[[dict[str, Any]], None], seal: bool) -> None:
    """``good.json``'s content changed by ``edit``, written as ``name``; re-sealed when ``seal``."""
    from adaptcheck.base.integrity import DIGEST_FIELD, compute_digest
    from adaptcheck.base.schemas.results import RunResults

    content = json.loads(RunResults.load(GOOD_SOURCE).model_dump_json())
    content[DIGEST_FIELD] = compute_digest(content)
    edit(content)
    if seal:
        content[DIGEST_FIELD] = compute_digest(content)
    (tmp / name).write_text(json.dumps(content, indent=2))


def _edited_json(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    def flip(c: dict[str, Any]) -> None:
        c["checks"][0]["status"] = "fail" if c["checks"][0]["status"] == "pass" else "pass"

    _sealed_variant(tmp, "edited.json", flip, seal=False)


def _undigested_json(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    _sealed_variant(tmp, "undigested.json", lambda c: c.pop("digest"), seal=False)


HOSTILE = "EPYC\x1b]0;pwned\x07\x1b[2J"


def _escape_json(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    def poison(c: dict[str, Any]) -> None:
        c["device"]["device_name"] = HOSTILE
        c["checks"][-1]["message"] = "broken " + HOSTILE

    _sealed_variant(tmp, "escape.json", poison, seal=True)


def _run_edited_ladder(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    import hashlib

    from adaptcheck.base.schemas.results import DeviceRef, LadderRef, utcnow
    from adaptcheck.ladder.loader import load_ladder
    from adaptcheck.runfolder import LADDER_SNAPSHOT, RUN_META, RunMeta

    run = tmp / "run2"
    run.mkdir()
    text = load_ladder("quick").text  # what a run stores: the resolved ladder
    meta = RunMeta(run_id="r2", started_at=utcnow(), command=["adaptcheck", "run"],
                   ladder=LadderRef(id="quick", version="1", source="builtin:quick",
                                    sha256=hashlib.sha256(text.encode()).hexdigest()),
                   seed=0, steps=[1], device=DeviceRef(backend="cpu", display_name="CPU", torch_device="cpu",
                                                        device_name="cpu", device_count=1))
    (run / RUN_META).write_text(meta.model_dump_json(indent=2))
    (run / LADDER_SNAPSHOT).write_text(text.replace("timeout_s:", "timeout_s:  ", 1), encoding="utf-8")


SETUPS: dict[str, Setup] = {
    "afile": _afile, "read-only-out": _read_only_out, "read-only-cwd": _read_only_cwd, "good-json": _good_json,
    "deep-json": _deep_json, "digits-json": _digits_json, "huge-json": _huge_json, "bad-json": _bad_json,
    "not-utf8-json": _not_utf8_json, "deep-ladder": _deep_ladder, "bomb-ladder": _bomb_ladder,
    "digits-ladder": _digits_ladder, "huge-ladder": _huge_ladder, "dup-ladder": _dup_ladder,
    "run-without-ladder": _run_without_ladder, "edited-json": _edited_json, "undigested-json": _undigested_json,
    "escape-json": _escape_json, "run-edited-ladder": _run_edited_ladder,
    "typo-child-ladder": _typo_child_ladder, "cycle-ladders": _cycle_ladders, "orphan-ladder": _orphan_ladder,
}
IN_PROCESS_ONLY = {"read-only-out", "read-only-cwd"}  # they patch this process


# --- running ---------------------------------------------------------------------------

ROWS = read_rows()
RUNNABLE = [r for r in ROWS if r.covered_by is None]
COVERED = [r for r in ROWS if r.covered_by is not None]
# Raw control characters (ESC, BEL, CR, …) that must never reach a terminal; newline and tab may.
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _old_click() -> bool:
    """True when the click in use predates 8.2 (no-args help exits 0 there)."""
    try:
        import typer._click  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
        return False  # typer's own click follows click >= 8.2
    except ImportError:
        from importlib.metadata import version

        major, minor = (int(x) for x in version("click").split(".")[:2])
        return (major, minor) < (8, 2)


def expected_exit(row: Row) -> int:
    return row.exit_old_click if row.exit_old_click is not None and _old_click() else row.exit


def prepare(row: Row, tmp: Path, mp: pytest.MonkeyPatch) -> None:
    mp.chdir(tmp)
    for name in row.setups:
        SETUPS[name](tmp, mp)


def check_output(row: Row, code: int, output: str) -> None:
    assert not CONTROLS.search(output), f"{row.id}: raw control character printed: {output!r}"
    assert code != ExitCode.INTERNAL, f"{row.id}: exit 70 (internal error) for a user's mistake:\n{output}"
    assert code == expected_exit(row), f"{row.id}: exit {code}, expected {expected_exit(row)}:\n{output}"
    assert "Traceback" not in output, f"{row.id}: traceback shown:\n{output}"
    assert row.fragment in output, f"{row.id}: {row.fragment!r} not in:\n{output}"
    if code != 0 and not row.fragment.startswith(HELP_FRAGMENT):
        errors = [ln for ln in output.splitlines() if ln.startswith("adaptcheck: error:")]
        assert len(errors) == 1, f"{row.id}: expected one error line:\n{output}"
        assert row.fragment in errors[0], f"{row.id}: the fragment is not in the error line:\n{output}"


def run_in_process(args: list[str]) -> tuple[int, str]:
    """The CLI's entry point in this process (tests/inprocess.py), output of both streams."""
    done = invoke(args)
    return done.returncode, done.stdout + done.stderr


def console_script() -> Path:
    script = Path(sys.executable).parent / "adaptcheck"
    assert script.is_file(), f"the adaptcheck console script is not installed beside {sys.executable}"
    return script


# --- the table ---------------------------------------------------------------------------


def test_table_is_complete_and_well_formed() -> None:
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    assert ISSUE_CASES <= set(ids), f"rows missing for cases of the issue: {sorted(ISSUE_CASES - set(ids))}"
    used = {s for r in ROWS for s in r.setups}
    assert used <= set(SETUPS), f"unknown setups: {sorted(used - set(SETUPS))}"
    assert set(SETUPS) <= used, f"setups no row uses: {sorted(set(SETUPS) - used)}"
    for r in RUNNABLE:
        assert r.run in RUN_MODES, f"{r.id}: run must be one of {sorted(RUN_MODES)} or covered: FILE::TEST"
        assert r.args is not None and r.fragment, f"{r.id}: a runnable row needs a command and a message"
        assert r.exit != ExitCode.INTERNAL
        if r.run != "in-process":
            assert not set(r.setups) & IN_PROCESS_ONLY, f"{r.id}: setup patches this process; run it in-process"
    # The doc's setup list names every setup (and nothing else).
    doc_setups = set(re.findall(r"^\| `([a-z0-9-]+)` \|", DOC.read_text(encoding="utf-8"), re.MULTILINE))
    assert doc_setups == set(SETUPS)


@pytest.mark.parametrize("row", COVERED, ids=lambda r: r.id)
def test_covered_rows_name_a_test_that_exists(row: Row) -> None:
    """A row run elsewhere must name a test the suite really has, so it cannot silently vanish."""
    assert row.covered_by is not None
    file, _, name = row.covered_by.partition("::")
    source = (ROOT / file).read_text(encoding="utf-8")
    assert re.search(rf"^def {re.escape(name)}\(", source, re.MULTILINE), f"{row.id}: {row.covered_by} does not exist"


@pytest.mark.parametrize("row", [r for r in RUNNABLE if r.run in ("in-process", "both")], ids=lambda r: r.id)
def test_bad_input_in_process(row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare(row, tmp_path, monkeypatch)
    assert row.args is not None
    code, output = run_in_process(row.args)
    check_output(row, code, output)


@pytest.mark.parametrize("row", [r for r in RUNNABLE if r.run in ("subprocess", "both")], ids=lambda r: r.id)
def test_bad_input_through_console_script(row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare(row, tmp_path, monkeypatch)
    assert row.args is not None
    proc = subprocess.run([str(console_script()), *row.args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    check_output(row, proc.returncode, proc.stdout + proc.stderr)


# --- properties the table cannot express ------------------------------------------------


def test_alias_bomb_is_refused_in_well_under_a_second(tmp_path: Path) -> None:
    from adaptcheck.base.errors import LadderError
    from adaptcheck.ladder.loader import parse_ladder

    assert len(BOMB.encode()) == 342
    start = time.perf_counter()
    with pytest.raises(LadderError, match=r"bomb\.yaml:2: YAML refused: alias \*a"):
        parse_ladder(BOMB, "bomb.yaml")
    assert time.perf_counter() - start < 0.2


def test_merge_keeps_the_good_file_when_one_input_is_hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _good_json(tmp_path, monkeypatch)
    _deep_json(tmp_path, monkeypatch)
    _digits_json(tmp_path, monkeypatch)
    code, output = run_in_process(["matrix", "merge", "deep.json", "good.json", "digits.json",
                                   "--output", "m.json"])
    assert code == 0, output
    matrix = json.loads((tmp_path / "m.json").read_text())
    assert matrix["merged_runs"] == 1 and len(matrix["rows"]) == 1
    assert {s["path"] for s in matrix["skipped"]} == {"deep.json", "digits.json"}


def test_steps_forms_the_readme_shows_still_parse() -> None:
    """The stricter --steps parsing still accepts the forms the README shows."""
    from adaptcheck.session import parse_steps

    assert parse_steps("1,2", [1, 2, 3, 4, 5]) == [1, 2]
    assert parse_steps("2-3", [1, 2, 3, 4, 5]) == [2, 3]
    assert parse_steps(" 1 , 3-3 ,", [1, 2, 3, 4, 5]) == [1, 3]
    assert parse_steps("2-2", [1, 2, 3, 4, 5]) == [2]
    assert parse_steps(None, [1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5]


def _app_raising(exc: BaseException) -> typer.Typer:
    """A one-command app whose command raises ``exc`` (stands in for adaptcheck's app)."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.command()
    def boom() -> None:
        raise exc

    @app.command()
    def other() -> None:  # two commands, so 'boom' is a subcommand as in the real app
        pass

    return app


def _raised_by_click_packages() -> list[tuple[str, Callable[[], BaseException]]]:
    """Usage errors of every click importable here: typer's own (0.29+) and the click package."""
    makers: list[tuple[str, Callable[[], BaseException]]] = []
    try:
        from typer._click import exceptions as vendored  # type: ignore[import-not-found,unused-ignore]

        makers.append(("typer._click", lambda: vendored.BadParameter("not good")))
    except ImportError:
        pass
    try:
        import click.exceptions as plain

        makers.append(("click", lambda: plain.BadParameter("not good")))
    except ImportError:
        pass
    assert makers, "neither typer._click nor click is importable"
    return makers


@pytest.mark.parametrize("source,make", _raised_by_click_packages(), ids=lambda v: v if isinstance(v, str) else "")
def test_usage_errors_of_either_click_exit_2(source: str, make: Callable[[], BaseException],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_app, "app", _app_raising(make()))
    code, output = run_in_process(["boom"])
    assert code == ExitCode.USAGE, output
    assert output.count("adaptcheck: error:") == 1 and "not good" in output


def test_a_genuine_bug_is_still_exit_70(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_app, "app", _app_raising(RuntimeError("a real bug")))
    code, output = run_in_process(["boom"])
    assert code == ExitCode.INTERNAL
    assert "internal error (RuntimeError: a real bug)" in output


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), typer.Abort()], ids=["ctrl-c", "abort"])
def test_interrupt_and_abort_exit_130(exc: BaseException, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_app, "app", _app_raising(exc))
    code, output = run_in_process(["boom"])
    assert code == ExitCode.INTERRUPTED, output
    assert "interrupted" in output


def test_typer_exit_code_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_app, "app", _app_raising(typer.Exit(4)))
    code, _ = run_in_process(["boom"])
    assert code == 4
