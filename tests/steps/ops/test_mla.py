"""MLA ops (mla_decode, mla_prefill): the torch provider and vLLM's CPU MLA decode kernel pass over
seeds; each planted defect (tests/steps/ops/mla_defects.py) fails in fp32 and bf16."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.catalog import get_op
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families.mla import GARBAGE_STD, MlaDecodeCase, MlaPrefillCase
from adaptcheck.steps.ops.providers.base import DictProvider, OpProvider
from tests.steps.ops.mla_defects import decode_defects, prefill_defects

# DeepSeek's proportions scaled down (rope a third of the q·k width, P == V) so that the torch
# tests take milliseconds; vLLM's kernel needs the real latent width (L + R = 576).
SMALL = {"num_heads": 4, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}
VLLM_DIMS = {"num_heads": 4, "kv_lora_rank": 512, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64}
DECODE: list[Mapping[str, object]] = [
    {"name": "ragged", "batch": 4, "max_seq_len": 37, **SMALL},  # lengths 37 (partial block), 1, random
    {"name": "len1", "batch": 1, "max_seq_len": 1, **SMALL},
    {"name": "sharp_block_multiple", "batch": 2, "max_seq_len": 32, "logit_std": 4.0, **SMALL},
]
PREFILL: list[Mapping[str, object]] = [
    {"name": "t24", "num_tokens": 24, **SMALL},
    {"name": "sharp", "num_tokens": 17, "logit_std": 4.0, **SMALL},
    {"name": "one_token", "num_tokens": 1, **SMALL},
]
VLLM_DECODE: list[Mapping[str, object]] = [{"name": "ragged", "batch": 3, "max_seq_len": 37, **VLLM_DIMS},
               {"name": "len1", "batch": 1, "max_seq_len": 1, **VLLM_DIMS}]
BOTH = {"fp32": Status.FAIL, "bf16": Status.FAIL}


def _run(provider: OpProvider, op: str, cases: list[Mapping[str, object]], dtypes: list[str],
         seed: int = 0) -> dict[str, Status]:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())
    params = OpCheckParams(op=op, dtypes=dtypes, cases=cases, budget_s=120)
    return {str(o.subid): o.status for o in OpCheck(provider).run(ctx, params)}


def _fn(op: str, fn: Callable[..., Any]) -> DictProvider:
    return DictProvider("under_test", {op: fn})


@pytest.mark.parametrize("seed", range(5))
def test_torch_provider_passes_across_seeds(seed: int) -> None:
    for op, cases in (("mla_decode", DECODE), ("mla_prefill", PREFILL)):
        assert _run(_fn(op, get_op(op).native), op, cases, ["fp32", "bf16"], seed) == \
            {"fp32": Status.PASS, "bf16": Status.PASS}, op
    if seed == 0:
        assert _run(_fn("mla_decode", get_op("mla_decode").native), "mla_decode", DECODE, ["fp16"]) == \
            {"fp16": Status.PASS}


@pytest.mark.parametrize("name", sorted(decode_defects(get_op("mla_decode").native)))
def test_decode_defects_are_caught(name: str) -> None:
    wrong = decode_defects(get_op("mla_decode").native)[name]
    assert _run(_fn("mla_decode", wrong), "mla_decode", DECODE[:1], ["fp32", "bf16"]) == BOTH, name


def test_a_decode_that_reads_no_partial_block_fails_even_on_a_single_key() -> None:
    wrong = decode_defects(get_op("mla_decode").native)["last_partial_block_ignored"]
    assert _run(_fn("mla_decode", wrong), "mla_decode", DECODE[1:2], ["fp32"]) == {"fp32": Status.FAIL}


@pytest.mark.parametrize("name", sorted(prefill_defects()))
def test_prefill_defects_are_caught(name: str) -> None:
    assert _run(_fn("mla_prefill", prefill_defects()[name]), "mla_prefill", PREFILL[:1], ["fp32", "bf16"]) == BOTH


def test_decode_inputs_hide_garbage_past_each_length_and_end_inside_a_block() -> None:
    case = MlaDecodeCase.model_validate(DECODE[0])
    inputs = get_op("mla_decode").make_inputs(case, "fp32", torch.Generator().manual_seed(0))
    kw = inputs.kwargs
    lens, tables, cache = kw["seq_lens"], kw["block_tables"], kw["kv_c_cache"]
    assert isinstance(lens, torch.Tensor) and isinstance(tables, torch.Tensor) and isinstance(cache, torch.Tensor)
    assert lens.tolist()[:2] == [37, 1] and inputs.notes["sequences_ending_in_a_partial_block"] == sum(
        1 for n in lens.tolist() if n % 16)
    assert int(tables.max()) == case.total_blocks - 1  # the highest block number is read
    tail = cache[tables[0, 2], 37 % 16:]  # slots after sequence 0's last token
    assert float(tail.std()) > GARBAGE_STD / 2 > float(cache[tables[0, 0]].std())


def test_scaled_cases_keep_the_layer_widths() -> None:
    decode = MlaDecodeCase.model_validate({"name": "x", "batch": 8, "max_seq_len": 64, "num_heads": 128})
    small = decode.scaled(0.01)
    assert small.batch < 8 and (small.kv_lora_rank, small.qk_rope_head_dim, small.block_size) == (512, 64, 16)
    prefill = MlaPrefillCase.model_validate({"name": "x", "num_tokens": 64, "num_heads": 128}).scaled(0.01)
    assert prefill.num_heads < 128 and prefill.kv_lora_rank == 512 and prefill.num_tokens >= 1


# ------------------------------------------------------------------ vLLM's CPU MLA decode kernel


@pytest.fixture(scope="module")
def vllm_provider() -> OpProvider:
    pytest.importorskip("vllm", reason="vLLM not installed (scripts/install-test-deps.sh)")
    from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider

    provider = VllmProvider()
    assert provider.available() == (True, "")
    return provider


@pytest.mark.parametrize("seed", range(5))
def test_vllm_mla_decode_kernel_passes_across_seeds(vllm_provider: OpProvider, seed: int) -> None:
    assert _run(vllm_provider, "mla_decode", VLLM_DECODE, ["fp32", "bf16"], seed) == \
        {"fp32": Status.PASS, "bf16": Status.PASS}
    if seed == 0:
        assert _run(vllm_provider, "mla_decode", VLLM_DECODE, ["fp16"]) == {"fp16": Status.PASS}


def test_vllm_mla_defects_are_caught(vllm_provider: OpProvider) -> None:
    adapter = vllm_provider.get("mla_decode")
    assert adapter is not None
    for name, wrong in decode_defects(adapter).items():
        assert _run(_fn("mla_decode", wrong), "mla_decode", VLLM_DECODE[:1], ["fp32", "bf16"]) == BOTH, name


def test_vllm_mla_prefill_is_not_applicable_and_other_widths_are_refused(vllm_provider: OpProvider) -> None:
    got = OpCheck(vllm_provider).run(
        CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=Path("."), model=ModelSpec()),
        OpCheckParams(op="mla_prefill", dtypes=["bf16"], cases=list(PREFILL[:1])))
    assert [(o.status, o.applicable) for o in got] == [(Status.SKIP, False)]
    assert "CPU_SDPA_MLA" in got[0].message and "AMX_MLA" in got[0].message
    adapter = vllm_provider.get("mla_decode")
    assert adapter is not None
    kw = get_op("mla_decode").make_inputs(MlaDecodeCase.model_validate(DECODE[0]), "fp32",
                                          torch.Generator().manual_seed(0)).kwargs
    with pytest.raises(ValueError, match="576"):
        adapter(**kw)
