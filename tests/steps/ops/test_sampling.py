"""Sampling ops: index truncation, k+1 and unsorted nucleus defects are caught; correct
reformulations (max-then-first-index, nucleus from the other end) pass."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families.sampling import greedy_sample, top_k_top_p_mask
from adaptcheck.steps.ops.providers.base import DictProvider

GREEDY = [{"name": "qwen_vocab", "batch": 6, "vocab": 151936},
          {"name": "one_row", "batch": 1, "vocab": 151936},
          {"name": "small", "batch": 5, "vocab": 1000}]
MASK = [{"name": "qwen_vocab", "batch": 6, "vocab": 151936},
        {"name": "small", "batch": 12, "vocab": 300, "head": 40},
        {"name": "one_row", "batch": 1, "vocab": 4096}]


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def _run(op: str, fn: Callable[..., Any], dtypes: list[str], cases: list[dict[str, Any]],
         seed: int = 0) -> dict[str, Status]:
    params = OpCheckParams(op=op, dtypes=dtypes, cases=cases, budget_s=120)
    return {str(o.subid): o.status for o in OpCheck(DictProvider("under_test", {op: fn})).run(_ctx(seed), params)}


def max_then_first_index(logits: torch.Tensor) -> torch.Tensor:
    """Correct: the row maximum, then the smallest index holding it."""
    top = logits.max(dim=-1, keepdim=True).values
    idx = torch.arange(logits.shape[-1], dtype=torch.int64).expand_as(logits)
    return torch.where(logits == top, idx, logits.shape[-1]).min(dim=-1).values


def truncated_vocab(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the first 65,536 entries only (a kernel sized for a 64k vocabulary)."""
    return torch.argmax(logits[:, :65536], dim=-1)


def int16_index(logits: torch.Tensor) -> torch.Tensor:
    """Indices carried in int16: everything past 32,767 wraps."""
    return torch.argmax(logits, dim=-1).to(torch.int16).to(torch.int64)


def nucleus_from_the_top(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Correct: sort descending, keep while the mass *before* a token is < p (p ≥ 1 keeps all)."""
    vals, idx = logits.sort(dim=-1, descending=True)
    keep_k = torch.arange(logits.shape[-1]).unsqueeze(0) < k.unsqueeze(1)
    vals = vals.masked_fill(~keep_k, float("-inf"))
    probs = torch.softmax(vals.float(), dim=-1)
    before = probs.cumsum(dim=-1) - probs
    keep = (before < p.unsqueeze(1)) | (p.unsqueeze(1) >= 1.0)
    vals = vals.masked_fill(~keep, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(1, idx, vals)


def top_k_plus_one(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Off by one: keeps k + 1 logits."""
    return top_k_top_p_mask(logits, (k + 1).clamp(max=logits.shape[-1]), p)


def nucleus_unsorted(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Top-k right, but the nucleus mass accumulated in vocabulary order, not sorted."""
    masked = top_k_top_p_mask(logits, k, torch.ones_like(p))
    probs = torch.softmax(masked.float(), dim=-1)
    before = probs.cumsum(dim=-1) - probs
    keep = (before < p.unsqueeze(1)) | (p.unsqueeze(1) >= 1.0)
    return masked.masked_fill(~keep, float("-inf"))


@pytest.mark.parametrize("seed", range(5))
def test_torch_and_alternatives_pass_across_seeds(seed: int) -> None:
    dts = ["fp32", "bf16", "fp16"]
    for fn in (greedy_sample, max_then_first_index):  # type: ignore[assignment]
        assert set(_run("greedy_sample", fn, dts, GREEDY, seed).values()) == {Status.PASS}
    for fn in (top_k_top_p_mask, nucleus_from_the_top):  # type: ignore[assignment]
        assert set(_run("top_k_top_p_mask", fn, dts, MASK, seed).values()) == {Status.PASS}


@pytest.mark.parametrize("wrong", [truncated_vocab, int16_index])
def test_greedy_index_defects_are_caught(wrong: Callable[..., Any]) -> None:
    assert _run("greedy_sample", wrong, ["fp32", "bf16"], GREEDY[:2]) == {"fp32": Status.FAIL, "bf16": Status.FAIL}


def test_greedy_masks_rows_tied_at_the_maximum() -> None:
    from adaptcheck.steps.ops.catalog import get_op

    op = get_op("greedy_sample")
    inputs = op.make_inputs(op.case_model.model_validate(GREEDY[0]), "bf16", torch.Generator().manual_seed(1))
    assert inputs.compare_mask is not None
    assert inputs.compare_mask.tolist() == [True] * 5 + [False]
    assert inputs.notes["argmax_positions"][:4] == [151935, 32768, 65536, 151934]


@pytest.mark.parametrize("wrong", [top_k_plus_one, nucleus_unsorted])
def test_mask_defects_are_caught(wrong: Callable[..., Any]) -> None:
    assert _run("top_k_top_p_mask", wrong, ["fp32", "bf16"], MASK[:2]) == {"fp32": Status.FAIL, "bf16": Status.FAIL}


def test_mask_inputs_cover_the_patterns() -> None:
    from adaptcheck.steps.ops.catalog import get_op

    op = get_op("top_k_top_p_mask")
    inputs = op.make_inputs(op.case_model.model_validate(MASK[1]), "bf16", torch.Generator().manual_seed(0))
    k, p = inputs.kwargs["k"].tolist(), inputs.kwargs["p"].tolist()
    assert 1 in k and 300 in k and 1.0 in p and min(p) < 1e-5
    assert any(0.0 < x < 1.0 and x > 1e-3 for x in p)
