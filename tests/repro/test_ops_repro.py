"""Step-3 reproducers: a failing op check writes a standalone script that shows the same figure.

The planted defect is a SiLU 0.1 % too large (tests/repro/planted_ops.py). The script runs in
a fresh ``python -I`` with adaptcheck blocked; its inputs are compared bit for bit with the
harness's, and its error figures number for number with the check's.
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.ladder.loader import load_ladder
from adaptcheck.repro.bundle import Bundle, BundleError
from adaptcheck.repro.ops import OpsReproCase, render_ops_script
from adaptcheck.steps.ops.catalog import get_op
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families.quant import fp8_flavour_scope
from adaptcheck.steps.ops.providers.base import DictProvider
from adaptcheck.steps.ops.providers.registry import load_provider
from adaptcheck.steps.ops.repro import build_spec, case_namespace
from tests.repro.planted_ops import scaled_silu
from tests.repro.standalone import adaptcheck_blocked, run_standalone

REPO = Path(__file__).resolve().parents[2]
CASES = [{"name": "mixed_rows", "tokens": 8, "width": 64}, {"name": "odd_single", "tokens": 1, "width": 11, "dist": "normal"}]
LINE = re.compile(r"case '(?P<case>[^']+)' (?P<dtype>\w+) output '(?P<out>\w+)': ratio=(?P<ratio>\S+) max_abs=(?P<max_abs>\S+)")


def _ctx(run_dir: Path, seed: int = 11) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=run_dir, model=ModelSpec(),
                        check_id="ops.silu")


def _run_planted(run_dir: Path) -> Any:
    params = OpCheckParams(op="silu", dtypes=["fp32"], cases=CASES)
    (outcome,) = OpCheck(DictProvider("planted", {"silu": scaled_silu})).run(_ctx(run_dir), params)
    return outcome


def _equal_bits(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point() or a.is_complex():
            width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
            return torch.equal(a.contiguous().view(width), b.contiguous().view(width))
        return torch.equal(a, b)
    return bool(a == b)


def test_failing_case_writes_a_standalone_script_that_prints_the_checks_figure(tmp_path: Path) -> None:
    assert adaptcheck_blocked(), "the isolation wrapper must make `import adaptcheck` fail"
    outcome = _run_planted(tmp_path)
    assert outcome.status is Status.FAIL
    assert outcome.details["repro"] == "repro/ops.silu.fp32.py"
    script = tmp_path / outcome.details["repro"]
    assert script.is_file()
    text = script.read_text()
    assert not re.search(r"^\s*(import|from)\s+(adaptcheck|reference_kernels|tests)\b", text, re.MULTILINE)

    done = run_standalone(script)
    assert done.returncode == 1, done.stdout + done.stderr
    printed = {(m["case"], m["out"]): (float(m["ratio"]), float(m["max_abs"])) for m in LINE.finditer(done.stdout)}
    failing = [c for c in outcome.details["cases"] if not c["passed"]]
    assert failing, "the planted defect must fail at least one case"
    for case in failing:
        out = case["outputs"][0]
        # Same code, same inputs, same op on the same CPU: the very same numbers.
        assert printed[(case["case"], "out")] == (out["ratio"], out["max_abs"])
    assert f"{len(failing)}/{len(failing)} cases out of tolerance" in done.stdout.splitlines()[-1]


def test_script_rebuilds_the_checks_inputs_bit_for_bit(tmp_path: Path) -> None:
    outcome = _run_planted(tmp_path)
    script = tmp_path / outcome.details["repro"]
    dump = tmp_path / "inputs"
    done = run_standalone(script, "--dump-inputs", str(dump))
    assert done.returncode == 1, done.stderr
    op = get_op("silu")
    recorded = [c for c in outcome.details["cases"] if not c["passed"]]
    for case in recorded:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(case["seed"])
        expected = op.make_inputs(op.case_model.model_validate(case["params"]), "fp32", gen)
        saved = torch.load(dump / f"{case['case']}.pt", weights_only=True)
        assert saved["kwargs"].keys() == expected.kwargs.keys()
        assert all(_equal_bits(expected.kwargs[k], saved["kwargs"][k]) for k in expected.kwargs)


def test_a_different_seed_would_give_different_inputs(tmp_path: Path) -> None:
    """The bit-equality above is not vacuous: the recorded seed is what makes the inputs."""
    op = get_op("silu")
    case = op.case_model.model_validate(CASES[0])
    a, b = torch.Generator(), torch.Generator()
    a.manual_seed(1)
    b.manual_seed(2)
    assert not _equal_bits(op.make_inputs(case, "fp32", a).kwargs["x"], op.make_inputs(case, "fp32", b).kwargs["x"])


def _quick_ladder_first_cases() -> list[tuple[str, dict[str, Any], str]]:
    ladder = load_ladder("quick").data  # resolved: quick extends standard
    seen: dict[str, tuple[str, dict[str, Any], str]] = {}
    for check in ladder["checks"]:
        if check.get("kind") == "ops.op" and check["params"]["op"] not in seen:
            p = check["params"]
            seen[p["op"]] = (p["op"], p["cases"][0], p["dtypes"][-1])
    return list(seen.values())


@pytest.mark.parametrize(("op_name", "case_params", "dtype"), _quick_ladder_first_cases(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_every_catalog_op_bundles_and_rebuilds_identical_inputs(tmp_path: Path, op_name: str,
                                                                 case_params: dict[str, Any], dtype: str) -> None:
    """Every op of the quick ladder (torch provider): the script's generator is the harness's."""
    op = get_op(op_name)
    fn = load_provider("torch").get(op_name)
    assert fn is not None
    case = op.case_model.model_validate(case_params)
    spec = build_spec(check_id=f"ops.{op_name}.{dtype}", op=op, fn=fn, provider="torch", provider_description="",
                      dtype=dtype, device="cpu", device_type="cpu", torch_module="cpu", extension_module=None,
                      fp8_flavour="e4m3fn", cases=[OpsReproCase(case.name, case_namespace(op, case_params), 4321)])
    script = tmp_path / "s.py"
    script.write_text(render_ops_script(spec))
    ns = runpy.run_path(str(script), run_name="repro_under_test")
    got = ns["build_inputs"](ns["CASES"][0])
    gen = torch.Generator(device="cpu")
    gen.manual_seed(4321)
    with fp8_flavour_scope("e4m3fn"):
        expected = op.make_inputs(case, dtype, gen)
    assert got.kwargs.keys() == expected.kwargs.keys()
    for key, value in expected.kwargs.items():
        assert _equal_bits(value, got.kwargs[key]), f"{op_name}: input {key} differs"
    assert _equal_bits(expected.compare_mask, got.compare_mask) if expected.compare_mask is not None else got.compare_mask is None


def test_bundle_refuses_what_it_cannot_inline() -> None:
    """A closure would be copied without its captured state: refused, not silently wrong."""
    factor = 2.0

    def closure(x: torch.Tensor) -> torch.Tensor:
        return x * factor

    with pytest.raises(BundleError, match="not a module-level definition"):
        Bundle().add_object(closure, "op")


def test_renamed_collisions_keep_each_definition(tmp_path: Path) -> None:
    """The torch op and the reference share the name ``silu``: both survive, each as itself."""
    op = get_op("silu")
    fn = load_provider("torch").get("silu")
    spec = build_spec(check_id="ops.silu.fp32", op=op, fn=fn, provider="torch", provider_description="", dtype="fp32",
                      device="cpu", device_type="cpu", torch_module="cpu", extension_module=None, fp8_flavour=None,
                      cases=[OpsReproCase("c", case_namespace(op, CASES[1]), 5)])
    script = tmp_path / "s.py"
    script.write_text(render_ops_script(spec))
    done = run_standalone(script)
    assert done.returncode == 0, done.stdout + done.stderr  # torch's SiLU is correct
    assert "PASS ops.silu.fp32: 1 case within tolerance" in done.stdout
