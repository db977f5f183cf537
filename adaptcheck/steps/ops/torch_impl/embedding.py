"""Torch provider: embedding lookup through ``F.embedding`` (what ``nn.Embedding`` calls)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, table)


TORCH_OPS: dict[str, Callable[..., Any]] = {"embedding": embedding}
