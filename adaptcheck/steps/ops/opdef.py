"""What an operator is, for step 3: an :class:`OpDef` ties together its case model, input
generator, float64 reference, device-generic torch implementation, tolerance class per output
and the provider signature (each part, and adding an op: docs/adding-an-op.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import numpy as np
    import torch


class CaseBase(BaseModel):
    """Base of every op's case model: a name and strict fields."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Case name shown in the report, e.g. 'long_k'.")

    def scaled(self, factor: float) -> CaseBase:
        """A smaller case for a slow device: ``factor`` < 1 is the fraction of work to keep.

        Ops override this for their large dimensions (K, sequence length, vocabulary …);
        the default keeps the case as it is.
        """
        return self

    def work(self) -> float:
        """Rough floating-point work of the case (for sizing against the device's speed)."""
        return 1.0


OpArg: TypeAlias = "torch.Tensor | torch.dtype | bool | int | float | str | None"
"""One keyword argument of an op call: a tensor, a dtype (an output dtype) or a plain scalar."""


@dataclass
class OpInputs:
    """Arguments of one op call. Tensors are on the CPU in their final dtype."""

    kwargs: dict[str, OpArg]
    """Keyword arguments: torch tensors and plain Python scalars."""
    notes: Mapping[str, object] = field(default_factory=dict)
    """What is special about these inputs (shown in the report): the op's own facts, any
    JSON-able values (the harness stores them as JSON)."""
    compare_mask: torch.Tensor | None = None
    """Optional bool mask over the first output: only these positions are compared (e.g. rows
    of a greedy sample whose top-1/top-2 gap is clear)."""


@dataclass(frozen=True)
class OpDef:
    """One operator."""

    name: str
    family: str
    description: str
    signature: str
    case_model: type[CaseBase]
    make_inputs: Callable[[Any, str, torch.Generator], OpInputs]
    reference: Callable[..., np.ndarray | tuple[np.ndarray, ...]]
    native: Callable[..., Any]
    """The torch provider's implementation, following ``signature`` (required: every op has a
    device-generic path, so ``--ops torch`` covers the whole catalog)."""
    outputs: tuple[str, ...]
    tolerance: tuple[str, ...]
    """Tolerance class per output (same length as ``outputs``)."""
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")
    """Dtypes the op is defined for."""
    requires: tuple[str, ...] = ()
    """Backend dtypes the op needs besides the checked dtype (``fp8_e4m3`` for fp8 ops, ``int8``
    for w8a8): where the backend does not claim one, the op is not applicable there."""
    device_scope: Callable[[Any], AbstractContextManager[None]] | None = None
    """Called with the backend; the harness enters the returned context around input
    generation, the provider call and the reference (the fp8 ops read the backend's fp8
    flavour from it)."""
    in_place: bool = False
    """The provider may write into its inputs (vLLM's fused add+RMSNorm, RoPE): the harness
    hands it clones and keeps the originals for the reference."""

    def __post_init__(self) -> None:
        if len(self.outputs) != len(self.tolerance):
            raise ValueError(f"op {self.name}: one tolerance class per output needed")
