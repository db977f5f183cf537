"""Torch provider: activations family.

The public torch ops a model calls: ``F.silu``, ``F.gelu`` (erf / ``approximate='tanh'``),
SwiGLU as vLLM's ``SiluAndMul.forward_native`` writes it, and ``torch.softmax`` in the
input dtype (so a device's half-precision softmax kernel is what gets checked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="none")


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


TORCH_OPS: dict[str, Callable[..., Any]] = {
    "silu": silu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "silu_and_mul": silu_and_mul,
    "softmax": softmax,
}
