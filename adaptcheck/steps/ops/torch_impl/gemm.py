"""Torch provider: GEMM family."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.bmm(a, b)


TORCH_OPS: dict[str, Callable[..., Any]] = {"gemm": gemm, "bmm": bmm}
