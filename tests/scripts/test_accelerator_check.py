"""scripts/accelerator-check.sh on this CPU (`--device cpu`): the fresh venv keeps the torch it
was given, installs adaptcheck itself, runs the ladder and packs the run folder.

The test's own interpreter (a venv with torch, vLLM and adaptcheck) stands for "the Python
with the vendor's torch": the script's venv must import that very torch (never a copy of its
own), and adaptcheck from its own site-packages (really installed, not the checkout). Steps
1 (and 1,2 in the end-to-end test) keep it short; the standard ladder on an accelerator is
the same command without --ladder/--steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "accelerator-check.sh"


def _run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False)


def _results_from_tarball(tarball: Path) -> dict:
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        member = next(n for n in names if n.endswith("/results.json"))
        data = json.load(tar.extractfile(member))  # type: ignore[arg-type]
        assert any(n.endswith("/accelerator-check.log") for n in names), names
    return data


@pytest.mark.slow
def test_cpu_run_keeps_torch_installs_adaptcheck_and_packs_the_folder(tmp_path: Path) -> None:
    venv, out = tmp_path / "venv", tmp_path / "reports" / "run1"
    proc = _run("--device", "cpu", "--ladder", "quick", "--steps", "1,2", "--python", sys.executable,
                "--venv", str(venv), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    err = proc.stderr

    # torch is the caller's, found through the venv (no torch inside the venv's own site-packages)
    assert f"torch {torch.__version__} from {torch.__file__}" in err
    own_site = next((venv / "lib").glob("python*/site-packages"))
    assert not (own_site / "torch").exists()
    assert f"torch=={torch.__version__}" in (venv / "keep-constraints.txt").read_text()
    # adaptcheck really installed into the venv, not imported from the checkout
    assert f"adaptcheck from {own_site}/adaptcheck/__init__.py" in err
    assert (own_site / "adaptcheck" / "__init__.py").is_file()

    tarball = out.with_name("run1.tar.gz")
    assert f"tarball {tarball}" in err and tarball.is_file()
    results = _results_from_tarball(tarball)
    assert results["device"]["backend"] == "cpu" and results["ladder"]["id"] == "quick"
    assert {str(c["step"]) for c in results["checks"]} == {"1", "2"}
    assert results["grade"]["level"] == "L1"  # steps 1,2 on a healthy CPU

    # Rerun in the same venv without installing; options after -- reach adaptcheck run.
    out2 = tmp_path / "reports" / "run2"
    proc2 = _run("--device", "cpu", "--ladder", "quick", "--steps", "1", "--python", sys.executable,
                 "--venv", str(venv), "--reuse-venv", "--out", str(out2), "--", "--seed", "7")
    assert proc2.returncode == 0, proc2.stdout[-3000:] + proc2.stderr[-3000:]
    assert "reusing" in proc2.stderr and "installing adaptcheck" not in proc2.stderr
    again = _results_from_tarball(out2.with_name("run2.tar.gz"))
    assert again["seed"] == 7 and {str(c["step"]) for c in again["checks"]} == {"1"}


def _python_without_torch() -> str:
    base = Path(sys.base_prefix) / "bin" / "python3"
    probe = subprocess.run([str(base), "-c", "import torch"], capture_output=True, check=False) if base.exists() else None
    if probe is None or probe.returncode == 0:
        pytest.skip("no interpreter without torch here")
    return str(base)


def test_no_torch_is_an_error_off_cpu(tmp_path: Path) -> None:
    proc = _run("--python", _python_without_torch(), "--venv", str(tmp_path / "venv"), "--out", str(tmp_path / "r"),
                timeout=120)
    assert proc.returncode == 1
    assert "has no torch" in proc.stderr and "vendor's torch" in proc.stderr
    assert not (tmp_path / "venv").exists()  # nothing was created, nothing installed


def test_a_folder_it_did_not_make_is_never_removed(tmp_path: Path) -> None:
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "keep.txt").write_text("data")
    proc = _run("--device", "cpu", "--python", sys.executable, "--venv", str(precious), "--out", str(tmp_path / "r"),
                timeout=120)
    assert proc.returncode == 2 and "was not made by this script" in proc.stderr
    assert (precious / "keep.txt").read_text() == "data"


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unknown option --bogus"),
    (["--device"], "--device needs a value"),
    (["--python", "/no/such/python"], "no Python '/no/such/python'"),
])
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    proc = _run(*args, "--venv", str(tmp_path / "venv"), timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "venv").exists()


def test_an_existing_run_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    proc = _run("--device", "cpu", "--python", sys.executable, "--venv", str(tmp_path / "venv"),
                "--out", str(tmp_path / "r"), timeout=60)
    assert proc.returncode == 2 and "exists already" in proc.stderr
    assert not (tmp_path / "venv").exists()
