"""adaptcheck.base.dtypes: the one dtype vocabulary, its map to torch, and step 2 / step 5 agreeing on fp8.

The map is checked against an independent table written here, every narrower alias against
the full vocabulary, and the fnuz switch per name. The last test is the one the duplicated
maps lacked: on an fnuz backend (MI300) the torch dtype the dtype smoke probe (step 2)
proves works must be the one the GEMM benchmark (step 5) times, for every fp8 name.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.dtypes import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    FP8_DTYPES,
    ITEMSIZE,
    CollectiveDtype,
    DeviceDtype,
    DtypeName,
    FloatDtype,
    GemmDtype,
    framework_dtype,
    is_fnuz,
    torch_dtype,
    torch_dtype_name,
)
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.ladder.check import CheckContext, NoParams
from adaptcheck.perf.micro import gemm_callable
from adaptcheck.steps.smoke.dtypes import DtypeProbeCheck

EXPECTED = {"fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
            "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "int8": torch.int8,
            "int32": torch.int32, "int64": torch.int64}
"""Written out independently of the module: OCP fp8 (NVIDIA, gfx950, CPU)."""

EXPECTED_FNUZ = {"fp8_e4m3": torch.float8_e4m3fnuz, "fp8_e5m2": torch.float8_e5m2fnuz}


class FnuzCpuBackend(CpuBackend):
    """A CPU that declares the MI300 fp8 flavour and every dtype (so fp8 is judged)."""

    name = "fnuz_cpu"
    fp8_flavour = "e4m3fnuz"
    dtypes = ALL_DTYPES


# --- the vocabulary ------------------------------------------------------------------------------

def test_every_name_has_a_torch_dtype_and_a_size() -> None:
    assert set(get_args(DtypeName)) == set(EXPECTED) == set(ITEMSIZE)
    for name, want in EXPECTED.items():
        assert torch_dtype(name) == want, name
        assert torch_dtype_name(name) == str(want).removeprefix("torch."), name
        assert ITEMSIZE[name] == want.itemsize, name


@pytest.mark.parametrize("alias", [FloatDtype, DeviceDtype, GemmDtype, CollectiveDtype])
def test_every_narrower_alias_is_part_of_the_vocabulary(alias: Any) -> None:
    names = get_args(alias)
    assert names and set(names) <= set(get_args(DtypeName))
    assert len(set(names)) == len(names)


def test_the_tuples_are_their_aliases() -> None:
    assert ALL_DTYPES == get_args(DeviceDtype) == ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8")
    assert FLOAT_DTYPES == get_args(FloatDtype) == ("fp32", "fp16", "bf16")
    assert set(FP8_DTYPES) == {n for n in get_args(DtypeName) if n.startswith("fp8")}


# --- fnuz ----------------------------------------------------------------------------------------

def test_fnuz_changes_exactly_the_fp8_names() -> None:
    for name, want in EXPECTED.items():
        assert torch_dtype(name, fnuz=True) == EXPECTED_FNUZ.get(name, want), name


@pytest.mark.parametrize("flavour, fnuz", [("e4m3fnuz", True), ("e4m3fn", False), (None, False)])
def test_the_backend_flavour_gives_the_flag(flavour: str | None, fnuz: bool) -> None:
    assert is_fnuz(flavour) is fnuz


# --- errors --------------------------------------------------------------------------------------

def test_an_unknown_name_is_a_clear_error() -> None:
    for call in (torch_dtype, torch_dtype_name, framework_dtype):
        with pytest.raises(ValueError, match=r"unknown dtype name 'fp4'; known: fp64, fp32, .*int64"):
            call("fp4")
    with pytest.raises(ValueError, match="unknown dtype name 'float32'"):
        torch_dtype("float32")  # torch's own spelling is not an adaptcheck name


def test_a_dtype_this_torch_lacks_says_which_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "float8_e4m3fnuz")
    with pytest.raises(AttributeError, match=rf"torch {re.escape(str(torch.__version__))} has no torch\.float8_e4m3fnuz"):
        torch_dtype("fp8_e4m3", fnuz=True)


# --- framework strings ---------------------------------------------------------------------------

def test_framework_strings_are_the_loadable_floats() -> None:
    assert {n: framework_dtype(n) for n in ("fp64", *FLOAT_DTYPES)} == {
        "fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
    for name in ("int8", "fp8_e4m3"):
        with pytest.raises(ValueError, match="not one a framework loads a model in"):
            framework_dtype(name)


# --- base layer ----------------------------------------------------------------------------------

def test_the_module_imports_no_adaptcheck_module() -> None:
    tree = ast.parse((Path(__file__).resolve().parents[1] / "adaptcheck" / "base" / "dtypes.py").read_text(encoding="utf-8"))
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.split(".")[0] == "adaptcheck"]


def test_importing_it_does_not_import_torch() -> None:
    code = "import sys, adaptcheck.base.dtypes; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- step 2 and step 5 agree -------------------------------------------------------------------

def _smoke_fp8_dtypes(monkeypatch: pytest.MonkeyPatch, backend: CpuBackend) -> dict[str, torch.dtype]:
    """{fp8 name: the torch dtype smoke.dtypes proves works} on ``backend``."""
    seen: list[torch.dtype] = []

    def record(self: DtypeProbeCheck, ctx: CheckContext, dtype: torch.dtype, info: dict[str, Any]) -> dict[str, str]:
        seen.append(dtype)
        return {"create": "ok"}

    monkeypatch.setattr(DtypeProbeCheck, "_fp8", record)
    ctx = CheckContext(backend=backend, device_index=0, seed=0, run_dir=Path("."), model=ModelSpec())
    DtypeProbeCheck().run(ctx, NoParams())
    fp8_names = [n for n in ALL_DTYPES if n.startswith("fp8")]  # the order the probe visits them
    return dict(zip(fp8_names, seen, strict=True))


def _perf_gemm_dtype(monkeypatch: pytest.MonkeyPatch, backend: CpuBackend, name: str) -> torch.dtype:
    """The torch dtype of the operands the step-5 GEMM benchmark times for ``name`` on ``backend``."""
    seen: list[torch.dtype] = []

    def record(a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        seen.extend((a.dtype, b.dtype))

    # Recorded, not run: the CPU has no fnuz GEMM; what matters is what it would be handed.
    monkeypatch.setattr(torch, "_scaled_mm", record)
    monkeypatch.setattr(torch, "matmul", record)
    gemm_callable(name, 16, 16, 16, torch.device("cpu"), backend)()
    assert len(set(seen)) == 1, seen
    return seen[0]


@pytest.mark.parametrize("backend", [FnuzCpuBackend(), CpuBackend()], ids=["fnuz", "ocp"])
def test_step5_times_the_fp8_dtype_step2_checked(monkeypatch: pytest.MonkeyPatch, backend: CpuBackend) -> None:
    checked = _smoke_fp8_dtypes(monkeypatch, backend)
    assert set(checked) == set(FP8_DTYPES)
    for name in FP8_DTYPES:
        assert _perf_gemm_dtype(monkeypatch, backend, name) == checked[name], name
    if is_fnuz(backend.fp8_flavour):
        assert checked == EXPECTED_FNUZ


def test_itemsize_reads_both_spellings() -> None:
    from adaptcheck.base.dtypes import itemsize

    assert (itemsize("bf16"), itemsize("bfloat16"), itemsize("float32"), itemsize("fp8_e4m3")) == (2, 2, 4, 1)
    assert itemsize("float8_e4m3fn") == 1 and itemsize("nosuch") is None
