"""Attention ops: realistic kernel defects are caught, correct reorderings pass, across seeds."""

from __future__ import annotations

import math
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
from adaptcheck.steps.ops.families import attention as ta
from adaptcheck.steps.ops.families.attention import (
    CacheWriteCase,
    PagedCase,
    PrefillCase,
)
from adaptcheck.steps.ops.providers.base import DictProvider

PREFILL = [
    {"name": "gqa4_d64", "num_tokens": 48, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64},
    {"name": "mha_d80", "num_tokens": 33, "num_q_heads": 2, "num_kv_heads": 2, "head_size": 80},
    {"name": "gqa8_d96_large_logits", "num_tokens": 40, "num_q_heads": 8, "num_kv_heads": 1, "head_size": 96,
     "logit_std": 6.0},
    {"name": "single_token", "num_tokens": 1, "num_q_heads": 4, "num_kv_heads": 1, "head_size": 128},
]
DECODE = [
    {"name": "gqa4_d128", "batch": 4, "max_seq_len": 70, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 128},
    {"name": "mha_d80_large_logits", "batch": 3, "max_seq_len": 33, "num_q_heads": 2, "num_kv_heads": 2,
     "head_size": 80, "logit_std": 6.0},
    {"name": "gqa8_d64_len1", "batch": 2, "max_seq_len": 1, "num_q_heads": 8, "num_kv_heads": 1, "head_size": 64},
]
PAGED = [
    {"name": "gqa4_d128", "batch": 4, "max_seq_len": 70, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 128},
    {"name": "mha_d96_large_logits", "batch": 3, "max_seq_len": 40, "num_q_heads": 2, "num_kv_heads": 2,
     "head_size": 96, "logit_std": 6.0, "block_size": 8, "num_blocks": 300},
    {"name": "gqa8_d64_len1", "batch": 2, "max_seq_len": 1, "num_q_heads": 8, "num_kv_heads": 1, "head_size": 64},
]
CACHE_WRITE = [
    {"name": "small", "num_tokens": 24, "num_kv_heads": 2, "head_size": 64, "num_blocks": 16, "num_padding": 3},
    {"name": "slots_past_2_16", "num_tokens": 32, "num_kv_heads": 1, "head_size": 16, "num_blocks": 4608,
     "num_padding": 2},
]
LARGE_LOGITS = [PREFILL[2]]


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def outcomes(op: str, fn: Callable[..., Any], dtypes: list[str], cases: list[dict[str, Any]],
             seed: int = 0) -> list[Any]:
    params = OpCheckParams(op=op, dtypes=dtypes, cases=cases)
    return OpCheck(DictProvider("under_test", {op: fn})).run(_ctx(seed), params)


def _run(op: str, fn: Callable[..., Any], dtypes: list[str], cases: list[dict[str, Any]],
         seed: int = 0) -> dict[str, Status]:
    return {o.subid: o.status for o in outcomes(op, fn, dtypes, cases, seed)}


def _expand(x: torch.Tensor, group: int, dim: int) -> torch.Tensor:
    return x.repeat_interleave(group, dim=dim)


# ---- prefill: correct alternative and defects ---------------------------------------------

def flash_reverse_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Online softmax (FlashAttention style): key blocks of 16 visited last to first, fp32 running
    max/sum/accumulator, probabilities cast to the input dtype before the P·V product as FA does."""
    tokens, num_q_heads, _ = q.shape
    group = num_q_heads // k.shape[1]
    qf = q.float().transpose(0, 1)  # [Hq, T, D]
    kf = _expand(k, group, 1).float().transpose(0, 1)
    vf = _expand(v, group, 1).transpose(0, 1)
    run_max = torch.full((num_q_heads, tokens, 1), -math.inf)
    run_sum = torch.zeros(num_q_heads, tokens, 1)
    acc = torch.zeros(num_q_heads, tokens, q.shape[2])
    rows = torch.arange(tokens)[:, None]
    for start in reversed(range(0, tokens, 16)):
        cols = torch.arange(start, min(tokens, start + 16))[None, :]
        s = (qf @ kf[:, start:start + 16].transpose(1, 2)) * scale
        s = s.masked_fill(cols > rows, -math.inf)
        new_max = torch.maximum(run_max, s.amax(dim=-1, keepdim=True))
        safe = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
        p = torch.exp(s - safe)
        correction = torch.exp(run_max - safe)
        run_sum = run_sum * correction + p.sum(dim=-1, keepdim=True)
        acc = acc * correction + (p.to(v.dtype) @ vf[:, start:start + 16]).float()
        run_max = new_max
    return (acc / run_sum).transpose(0, 1).to(q.dtype)


def _sdpa_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None,
                  gqa: str = "interleave") -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    if gqa == "interleave":
        k, v = _expand(k, group, 1), _expand(v, group, 1)
    else:  # head h reads kv head h % Hk
        k, v = k.repeat(1, group, 1), v.repeat(1, group, 1)
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                           attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


def _causal(tokens: int, diagonal: int = 0) -> torch.Tensor:
    return torch.ones(tokens, tokens, dtype=torch.bool).tril(diagonal)


def no_causal_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return _sdpa_prefill(q, k, v, scale, None)


def mask_off_by_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Each query also sees the next token (mask j <= i + 1)."""
    return _sdpa_prefill(q, k, v, scale, _causal(q.shape[0], 1))


def gqa_modulo(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Query head h reads kv head h % Hk instead of h // (Hq / Hk)."""
    return _sdpa_prefill(q, k, v, scale, _causal(q.shape[0]), gqa="modulo")


def scale_ignored(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return _sdpa_prefill(q, k, v, 1.0, _causal(q.shape[0]))


def scale_without_sqrt(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The kernel computes its own scale as 1/D instead of 1/sqrt(D)."""
    return _sdpa_prefill(q, k, v, 1.0 / q.shape[2], _causal(q.shape[0]))


def softmax_without_max(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """exp(scores) in the input dtype with no max subtraction: fp16 overflows past ~11."""
    group = q.shape[1] // k.shape[1]
    qh = q.float().transpose(0, 1)
    kh = _expand(k, group, 1).float().transpose(0, 1)
    vh = _expand(v, group, 1).float().transpose(0, 1)
    s = (qh @ kh.transpose(1, 2)) * scale
    e = torch.exp(s.to(q.dtype)).float().masked_fill(~_causal(q.shape[0]), 0.0)
    return ((e / e.sum(dim=-1, keepdim=True)) @ vh).transpose(0, 1).to(q.dtype)


# ---- decode / paged: correct alternatives and defects --------------------------------------

def decode_logsumexp_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                          scale: float) -> torch.Tensor:
    """Per sequence and head, weights exp(s - logsumexp(s)) in fp32."""
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[2]
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        for h in range(q.shape[1]):
            keys, values = k[b, :n, h // group].float(), v[b, :n, h // group].float()
            s = keys @ q[b, h].float() * scale
            out[b, h] = (torch.exp(s - torch.logsumexp(s, dim=0)) @ values).to(q.dtype)
    return out


def decode_ignores_seq_lens(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                            scale: float) -> torch.Tensor:
    return ta.decode_attention(q, k, v, torch.full_like(seq_lens, k.shape[1]), scale)


def decode_gqa_modulo(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """Query head h reads kv head h % Hk (kv heads tiled instead of repeated per group)."""
    group = q.shape[1] // k.shape[2]
    return ta.decode_attention(q, k.repeat(1, 1, group, 1), v.repeat(1, 1, group, 1), seq_lens, scale)


def paged_split_reverse(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Flash-decoding: one partial softmax per cache block, merged last block first by log-sum-exp."""
    block_size = key_cache.shape[1]
    group = q.shape[1] // key_cache.shape[2]
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        qb = q[b].float()  # [Hq, D]
        parts = []
        for j in range(-(-n // block_size)):
            valid = min(block_size, n - j * block_size)
            blk = int(block_tables[b, j])
            keys = _expand(key_cache[blk, :valid], group, 1).float()  # [valid, Hq, D]
            values = _expand(value_cache[blk, :valid], group, 1).float()
            s = torch.einsum("hd,thd->ht", qb, keys) * scale
            lse = torch.logsumexp(s, dim=-1, keepdim=True)  # [Hq, 1]
            parts.append((lse, torch.einsum("ht,thd->hd", torch.exp(s - lse), values)))
        total_lse = torch.logsumexp(torch.cat([p[0] for p in parts], dim=-1), dim=-1, keepdim=True)
        acc = torch.zeros_like(qb)
        for lse, partial in reversed(parts):
            acc += torch.exp(lse - total_lse) * partial
        out[b] = acc.to(q.dtype)
    return out


def paged_block_table_off_by_one(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Logical block j read from table column j + 1 (wrapping at the end of the row)."""
    return ta.paged_attention(q, key_cache, value_cache, block_tables.roll(-1, dims=1), seq_lens, scale)


def paged_ignores_seq_lens(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Attends to whole blocks: the stale tail of each sequence's last block leaks in."""
    full = -(-seq_lens // key_cache.shape[1]) * key_cache.shape[1]
    return ta.paged_attention(q, key_cache, value_cache, block_tables, full, scale)


# ---- reshape_and_cache: correct alternative and defects -------------------------------------

def cache_write_loop_reversed(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                              value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token at a time, last token first, addressing (block, offset) explicitly."""
    block_size = key_cache.shape[1]
    for t in reversed(range(key.shape[0])):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        key_cache[slot // block_size, slot % block_size] = key[t]
        value_cache[slot // block_size, slot % block_size] = value[t]
    return key_cache, value_cache


def cache_write_slot_off_by_one(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                                value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shifted = torch.where(slot_mapping >= 0, slot_mapping + 1, slot_mapping)
    return ta.reshape_and_cache(key, value, key_cache, value_cache, shifted)


def cache_write_padding_written(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                                value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """No padding check: slot -1 indexes (wraps to) the last slot of the cache."""
    key_cache.view(-1, *key_cache.shape[2:])[slot_mapping] = key
    value_cache.view(-1, *value_cache.shape[2:])[slot_mapping] = value
    return key_cache, value_cache


def cache_write_int16_slots(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot numbers narrowed to int16 (padding still recognised): slots past 32767 wrap."""
    narrow = torch.where(slot_mapping >= 0, slot_mapping.to(torch.int16).to(torch.int64) % key_cache[:, :, 0, 0].numel(),
                         slot_mapping)
    return ta.reshape_and_cache(key, value, key_cache, value_cache, narrow)


# ---- tests --------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_torch_and_correct_alternatives_pass_across_seeds(seed: int) -> None:
    dtypes = ["fp32", "bf16", "fp16"]
    runs: list[tuple[str, Callable[..., Any], list[dict[str, Any]]]] = [
            ("prefill_attention", ta.prefill_attention, PREFILL), ("prefill_attention", flash_reverse_blocks, PREFILL),
            ("decode_attention", ta.decode_attention, DECODE), ("decode_attention", decode_logsumexp_loop, DECODE),
            ("paged_attention", ta.paged_attention, PAGED), ("paged_attention", paged_split_reverse, PAGED),
            ("reshape_and_cache", ta.reshape_and_cache, CACHE_WRITE),
            ("reshape_and_cache", cache_write_loop_reversed, CACHE_WRITE)]
    for op, fn, cases in runs:
        assert set(_run(op, fn, dtypes, cases, seed).values()) == {Status.PASS}, (op, fn.__name__)


@pytest.mark.parametrize("wrong", [no_causal_mask, mask_off_by_one, gqa_modulo, scale_ignored, scale_without_sqrt])
def test_prefill_defects_are_caught(wrong: Callable[..., torch.Tensor]) -> None:
    assert set(_run("prefill_attention", wrong, ["fp32", "bf16", "fp16"], PREFILL).values()) == {Status.FAIL}


def test_softmax_without_max_subtraction_overflows_fp16_on_large_logits() -> None:
    assert _run("prefill_attention", softmax_without_max, ["fp16"], LARGE_LOGITS) == {"fp16": Status.FAIL}
    # With ordinary logits the same kernel is within tolerance: it is the large-logit case that exposes it.
    assert _run("prefill_attention", softmax_without_max, ["fp16"], [PREFILL[0]]) == {"fp16": Status.PASS}


@pytest.mark.parametrize("wrong", [decode_ignores_seq_lens, decode_gqa_modulo])
def test_decode_defects_are_caught(wrong: Callable[..., torch.Tensor]) -> None:
    assert set(_run("decode_attention", wrong, ["fp32", "bf16", "fp16"], DECODE).values()) == {Status.FAIL}


@pytest.mark.parametrize("wrong", [paged_block_table_off_by_one, paged_ignores_seq_lens])
def test_paged_defects_are_caught(wrong: Callable[..., torch.Tensor]) -> None:
    assert set(_run("paged_attention", wrong, ["fp32", "bf16", "fp16"], PAGED).values()) == {Status.FAIL}


@pytest.mark.parametrize("wrong", [cache_write_slot_off_by_one, cache_write_padding_written])
def test_cache_write_defects_are_caught(wrong: Callable[..., Any]) -> None:
    assert set(_run("reshape_and_cache", wrong, ["fp32", "bf16", "fp16"], CACHE_WRITE).values()) == {Status.FAIL}


def test_int16_slots_are_caught_only_past_32767() -> None:
    assert _run("reshape_and_cache", cache_write_int16_slots, ["bf16"], [CACHE_WRITE[1]]) == {"bf16": Status.FAIL}
    assert _run("reshape_and_cache", cache_write_int16_slots, ["bf16"], [CACHE_WRITE[0]]) == {"bf16": Status.PASS}


def test_inputs_have_the_promised_adversarial_properties() -> None:
    from adaptcheck.steps.ops.families.attention import OPS

    ops = {op.name: op for op in OPS}
    gen = torch.Generator().manual_seed(0)
    paged = PagedCase.model_validate(PAGED[1])
    inp = ops["paged_attention"].make_inputs(paged, "fp32", gen).kwargs
    assert int(inp["block_tables"].max()) == paged.total_blocks - 1  # the highest block number is used
    assert int(inp["seq_lens"][0]) == paged.max_seq_len and int(inp["seq_lens"][1]) == 1
    assert inp["value_cache"].abs().max() > 100  # garbage where nothing was written

    write = CacheWriteCase.model_validate(CACHE_WRITE[1])
    inp = ops["reshape_and_cache"].make_inputs(write, "bf16", gen).kwargs
    slots = inp["slot_mapping"]
    assert int(slots.max()) == write.num_blocks * write.block_size - 2 > 2**16
    assert int((slots == -1).sum()) == write.num_padding
    real = slots[slots >= 0]
    assert real.unique().numel() == real.numel()

    big = PrefillCase.model_validate(PREFILL[2])
    inp = ops["prefill_attention"].make_inputs(big, "fp16", gen).kwargs
    logits = (inp["q"].float()[:, 0] @ inp["k"].float()[:, 0].T) * inp["scale"]
    assert logits.max() > 12  # exp overflows fp16 (max 65504 ≈ e^11.1) without max subtraction


def test_case_scaling_keeps_gqa_ratio_and_long_dimension_last() -> None:
    case = PrefillCase(name="x", num_tokens=4096, num_q_heads=32, num_kv_heads=8, head_size=128)
    small = case.scaled(0.01)
    assert small.num_q_heads // small.num_kv_heads == 4
    assert small.num_kv_heads == 1 and small.num_tokens < 4096
    assert small.work() <= case.work() * 0.02
    paged = PagedCase(name="p", batch=8, max_seq_len=4096, num_q_heads=32, num_kv_heads=8, head_size=128)
    assert paged.scaled(0.05).total_blocks < paged.total_blocks
    with pytest.raises(ValueError):
        PrefillCase(name="bad", num_tokens=4, num_q_heads=6, num_kv_heads=4, head_size=64)
