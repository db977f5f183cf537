"""Dtype names: the one vocabulary adaptcheck speaks, and its one map to torch and the frameworks.

Responsible for every dtype name a ladder, a backend or a result may carry (``fp32``,
``bf16``, ``fp8_e4m3`` …), the narrower sets each kind of check accepts (one ``Literal``
each, so a params model and its callers can never disagree on the spelling), bytes per
element, and the translation to a ``torch.dtype`` or to the ``dtype=`` strings vLLM and
transformers take.

fp8 has two families: the OCP formats (``float8_e4m3fn`` / ``float8_e5m2``, NVIDIA, gfx950,
the CPU) and MI300's ``fnuz`` formats (no negative zero, another bias, e4m3 max 240 not
448). A backend says which one it computes in through ``Backend.fp8_flavour``;
:func:`is_fnuz` turns that into the one flag :func:`torch_dtype` takes, so step 2 (which
proves a dtype works) and step 5 (which times it) always mean the same torch dtype.

Base layer: imports nothing from adaptcheck, and torch only inside :func:`torch_dtype`
(``adaptcheck backends`` and the collective launcher must run without importing it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import torch

DtypeName = Literal["fp64", "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int32", "int64"]
"""Every dtype name adaptcheck uses. The aliases below are subsets of it (a test holds them to that)."""

FloatDtype = Literal["fp32", "fp16", "bf16"]
"""The precisions a model is served and compared in, and that matmul, attention and the
timed collectives run in: the floats every torch device computes with ordinary arithmetic."""

DeviceDtype = Literal["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"]
"""What a backend may declare in ``Backend.dtypes`` and step 2 probes (``smoke.dtypes``, ``smoke.memory``)."""

GemmDtype = Literal["fp32", "fp16", "bf16", "fp8_e4m3", "int8"]
"""What step 5 times GEMMs in: the floats, plus fp8 e4m3 (``torch._scaled_mm``) and int8
(``torch._int_mm``), the two quantized GEMMs LLM serving uses."""

CollectiveDtype = Literal["fp32", "fp16", "bf16", "int8", "int32", "int64"]
"""What the exact collectives check moves: the floats and the integer widths libraries
implement with separate kernels (fp8 is not reduced by collective libraries)."""

ALL_DTYPES: tuple[DeviceDtype, ...] = get_args(DeviceDtype)
"""Every dtype a backend may declare, in the order step 2 reports them."""

FLOAT_DTYPES: tuple[FloatDtype, ...] = get_args(FloatDtype)

FP8_DTYPES: tuple[DtypeName, ...] = ("fp8_e4m3", "fp8_e5m2")
"""The names whose torch dtype depends on the backend's fp8 flavour."""

_TORCH_NAMES: dict[str, str] = {
    "fp64": "float64",
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "int8": "int8",
    "int32": "int32",
    "int64": "int64",
}
"""The torch attribute of each name, OCP fp8 (the torch attribute is also the string the
frameworks' ``dtype=`` options take for the floats)."""

_FNUZ_NAMES: dict[str, str] = {"fp8_e4m3": "float8_e4m3fnuz", "fp8_e5m2": "float8_e5m2fnuz"}
"""Where an fnuz backend differs: both fp8 formats, not only e4m3 (MI300 has no OCP e5m2 either)."""

_FRAMEWORK_DTYPES: tuple[DtypeName, ...] = ("fp64", *FLOAT_DTYPES)
"""Names a framework can load a model in: the serving floats, and fp64 for the CPU reference."""

ITEMSIZE: dict[str, int] = {"fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1,
                            "int8": 1, "int32": 4, "int64": 8}
"""Bytes per element, without importing torch (the collective launcher sizes buffers with it)."""

def itemsize(name: str) -> int | None:
    """Bytes per element of a dtype given by adaptcheck's name (``bf16``) or torch's (``bfloat16``,
    as config.json's ``torch_dtype`` says it); None for a name neither knows."""
    if name in ITEMSIZE:
        return ITEMSIZE[name]
    ours = next((k for k, v in _TORCH_NAMES.items() if v == name), None)
    return ITEMSIZE.get(ours) if ours is not None else None


FNUZ_FLAVOUR = "e4m3fnuz"
"""The ``Backend.fp8_flavour`` of MI300-class devices; 'e4m3fn' (OCP) and None (no fp8) are the others."""


def _check(name: str) -> None:
    if name not in _TORCH_NAMES:
        raise ValueError(f"unknown dtype name {name!r}; known: {', '.join(_TORCH_NAMES)}")


def is_fnuz(fp8_flavour: str | None) -> bool:
    """Whether a backend's declared fp8 flavour (``Backend.fp8_flavour``) is MI300's fnuz
    family. The one place the flag :func:`torch_dtype` takes is derived from a backend."""
    return fp8_flavour == FNUZ_FLAVOUR


def torch_dtype_name(name: str, *, fnuz: bool = False) -> str:
    """The torch attribute name of a dtype name (``"bf16"`` → ``"bfloat16"``); fp8 in the fnuz
    family when ``fnuz``. Raises ``ValueError`` for a name adaptcheck does not know."""
    _check(name)
    return _FNUZ_NAMES.get(name, _TORCH_NAMES[name]) if fnuz else _TORCH_NAMES[name]


def torch_dtype(name: str, *, fnuz: bool = False) -> torch.dtype:
    """The torch dtype of a dtype name; fp8 in the fnuz family when ``fnuz`` (pass
    ``is_fnuz(backend.fp8_flavour)``).

    Raises ``ValueError`` for a name adaptcheck does not know, and ``AttributeError`` (saying
    which torch) when this torch build lacks the dtype: the dtype smoke probe reports that
    as "does not exist here" rather than as a defect of the name.
    """
    import torch

    attr = torch_dtype_name(name, fnuz=fnuz)
    dtype = getattr(torch, attr, None)
    if not isinstance(dtype, torch.dtype):
        raise AttributeError(f"torch {torch.__version__} has no torch.{attr} (dtype {name!r})")
    return dtype


def framework_dtype(name: str) -> str:
    """The ``dtype=`` string vLLM and transformers take for a dtype name (``"bf16"`` →
    ``"bfloat16"``). Raises ``ValueError`` for a name no framework loads a model in."""
    _check(name)
    if name not in _FRAMEWORK_DTYPES:
        raise ValueError(f"dtype {name!r} is not one a framework loads a model in; one of"
                         f" {', '.join(_FRAMEWORK_DTYPES)}")
    return _TORCH_NAMES[name]
