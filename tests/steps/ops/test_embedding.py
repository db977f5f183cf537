"""Embedding lookup: index truncation and off-by-one bounds are caught, exact rewrites pass."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families.embedding import EmbeddingCase, make_ids
from adaptcheck.steps.ops.families.embedding import embedding as torch_embedding
from adaptcheck.steps.ops.providers.base import DictProvider

CASES: list[dict[str, Any]] = [
    {"name": "qwen_vocab", "tokens": 64, "vocab": 151936, "hidden": 16},
    {"name": "last_rows", "tokens": 16, "vocab": 151936, "hidden": 8, "ids": "high"},
    {"name": "repeated", "tokens": 32, "vocab": 40000, "hidden": 96, "ids": "repeated"},
    {"name": "single_token", "tokens": 1, "vocab": 1000, "hidden": 4096, "ids": "uniform"},
]
ALL = ["fp32", "fp16", "bf16"]


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def _run(fn: Callable[..., Any], dtypes: list[str], seed: int = 0,
         cases: list[dict[str, Any]] = CASES) -> dict[str, Status]:
    params = OpCheckParams(op="embedding", dtypes=dtypes, cases=cases)
    return {str(o.subid): o.status for o in OpCheck(DictProvider("under_test", {"embedding": fn})).run(_ctx(seed), params)}


def ids_as_int16(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Ids narrowed to int16: 32768 wraps to −32768 and reads a row from the wrong end."""
    return table[ids.to(torch.int16).to(torch.int64) % table.shape[0]]


def ids_as_uint16(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Ids masked to 16 bits: 65536 reads row 0."""
    return table[ids & 0xFFFF]


def last_row_clamped(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Bound check with < V − 1 instead of < V: id V − 1 is clamped to V − 2."""
    return table[ids.clamp(max=table.shape[0] - 2)]


def staged_through_bf16(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rows copied through a bf16 staging buffer (loses bits for fp32/fp16 tables)."""
    return table[ids].to(torch.bfloat16).to(table.dtype)


def one_hot_matmul(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Correct, computed differently: one-hot rows times the table in float64 (x·1 + Σ 0 is exact)."""
    one_hot = torch.nn.functional.one_hot(ids, table.shape[0]).to(torch.float64)
    return (one_hot @ table.to(torch.float64)).to(table.dtype)


def row_by_row(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Correct: index_select one id at a time."""
    return torch.cat([torch.index_select(table, 0, ids[t:t + 1]) for t in range(ids.shape[0])])


@pytest.mark.parametrize("seed", range(5))
def test_torch_lookup_is_exact_across_seeds(seed: int) -> None:
    assert _run(torch_embedding, ALL, seed) == {d: Status.PASS for d in ALL}


@pytest.mark.parametrize("alternative", [one_hot_matmul, row_by_row])
def test_rewritten_lookups_are_exact(alternative: Callable[..., torch.Tensor]) -> None:
    assert _run(alternative, ALL) == {d: Status.PASS for d in ALL}


@pytest.mark.parametrize("wrong", [ids_as_int16, ids_as_uint16, last_row_clamped])
def test_index_defects_are_caught_in_every_dtype(wrong: Callable[..., torch.Tensor]) -> None:
    assert _run(wrong, ALL) == {d: Status.FAIL for d in ALL}


def test_int16_truncation_is_caught_by_the_high_ids_case_alone() -> None:
    assert _run(ids_as_int16, ["bf16"], cases=[CASES[1]]) == {"bf16": Status.FAIL}


def test_lossy_staging_copy_is_caught_where_it_loses_bits() -> None:
    assert _run(staged_through_bf16, ["fp32", "fp16"]) == {"fp32": Status.FAIL, "fp16": Status.FAIL}
    assert _run(staged_through_bf16, ["bf16"]) == {"bf16": Status.PASS}  # a bf16 table loses nothing


def test_mixed_ids_hit_the_boundaries() -> None:
    case = EmbeddingCase(name="c", tokens=16, vocab=151936, hidden=8)
    ids = make_ids(case, torch.Generator().manual_seed(0)).tolist()
    assert {0, 151935, 32767, 32768, 65535, 65536} <= set(ids)
    assert ids.count(151935) >= 2


def test_case_limits_and_scaling_keep_the_vocabulary() -> None:
    with pytest.raises(ValidationError):
        EmbeddingCase(name="huge", tokens=1, vocab=151936, hidden=4096)
    small = EmbeddingCase(name="c", tokens=64, vocab=151936, hidden=1024).scaled(0.01)
    assert small.vocab == 151936 and small.hidden < 1024
