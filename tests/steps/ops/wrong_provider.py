"""A provider object for the ``--ops module:object`` end-to-end test: GEMM accumulating in bf16."""

from __future__ import annotations

import torch


def _bf16_accumulating_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.bfloat16, device=a.device)
    for i in range(0, a.shape[1], 16):
        acc = acc + (a[:, i:i + 16].float() @ b[i:i + 16].float()).to(torch.bfloat16)
    return acc.to(a.dtype)


BROKEN_OPS = {"gemm": _bf16_accumulating_gemm}
