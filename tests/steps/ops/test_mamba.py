"""Mamba2 ops: the torch provider and independent correct rewrites pass across seeds, every
planted defect (tests/steps/ops/mamba_planted.py) fails, and vLLM's kernels pass with defects
planted around them failing (one slow test, skipped without vLLM).
"""

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
from adaptcheck.steps.ops.providers.base import DictProvider, OpProvider
from tests.steps.ops.mamba_planted import DEFECTS

HEADS = {"heads": 4, "head_dim": 8, "state_size": 16}
CASES: dict[str, list[Mapping[str, object]]] = {
    "selective_state_update": [
        {"name": "gated_g2_steps3", "batch": 2, **HEADS, "groups": 2, "gate": True, "steps": 3},
        {"name": "threshold_steps2", "batch": 2, **HEADS, "dt_range": "threshold", "steps": 2},
        {"name": "state_fp32", "batch": 1, **HEADS, "state_fp32": True},
    ],
    "causal_conv1d_update": [{"name": "steps3", "batch": 2, "dim": 32, "steps": 3},
                             {"name": "no_silu", "batch": 1, "dim": 16, "silu": False}],
    "causal_conv1d_fwd": [{"name": "mixed", "dim": 32, "seq_lens": [9, 2, 13]},
                          {"name": "fresh", "dim": 16, "seq_lens": [5], "initial_state": "none", "silu": False}],
    "ssd_chunk_scan": [{"name": "chunks_gated", "seq_lens": [21, 5, 12], **HEADS, "groups": 2, "chunk_size": 8,
                        "gate": True},
                       {"name": "fresh", "seq_lens": [10], **HEADS, "initial_state": False}],
}
ALL = ["fp32", "bf16", "fp16"]


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def _run_provider(provider: OpProvider, op: str, dtypes: list[str], seed: int = 0) -> dict[str, Status]:
    params = OpCheckParams(op=op, dtypes=dtypes, cases=CASES[op], budget_s=120)
    return {str(o.subid): o.status for o in OpCheck(provider).run(_ctx(seed), params)}


def _run(op: str, fn: Callable[..., Any], dtypes: list[str], seed: int = 0) -> dict[str, Status]:
    return _run_provider(DictProvider("under_test", {op: fn}), op, dtypes, seed)


def ssd_token_by_token(**kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Correct, another way: the prefill scan as one decode update per token (the decode op's
    torch function), one sequence at a time."""
    ssu = get_op("selective_state_update").native
    cu = kw["cu_seqlens"].tolist()
    outs, finals = [], []
    for s in range(len(cu) - 1):
        part = slice(cu[s], cu[s + 1])
        per_token = {k: kw[k][part].unsqueeze(1) for k in ("x", "dt", "B", "C")}
        z = None if kw["z"] is None else kw["z"][part].unsqueeze(1)
        y, state = ssu(state=kw["initial_states"][s:s + 1], A=kw["A"], D=kw["D"], z=z, dt_bias=kw["dt_bias"],
                       dt_softplus=kw["dt_softplus"], **per_token)
        outs.append(y[:, 0])
        finals.append(state)
    return torch.cat(outs), torch.cat(finals)


def conv_fwd_by_updates(**kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Correct, another way: the prefill convolution as one decode update per token."""
    update = get_op("causal_conv1d_update").native
    cu = kw["query_start_loc"].tolist()
    outs, finals = [], []
    for s in range(len(cu) - 1):
        state = kw["conv_states"][s:s + 1]
        if not bool(kw["has_initial_state"][s]):
            state = torch.zeros_like(state)
        out, state = update(x=kw["x"][:, cu[s]:cu[s + 1]].t().unsqueeze(1), conv_state=state, weight=kw["weight"],
                            bias=kw["bias"], silu_activation=kw["silu_activation"])
        outs.append(out[:, 0].t())
        finals.append(state)
    return torch.cat(outs, dim=1), torch.cat(finals)


@pytest.mark.parametrize("seed", range(3))  # 5 seeds, at the ladder's sizes: benchmarks/family_mamba_ops.py
def test_torch_provider_and_rewrites_pass_across_seeds(seed: int) -> None:
    for op in CASES:
        assert set(_run(op, get_op(op).native, ALL, seed).values()) == {Status.PASS}, op
    assert set(_run("ssd_chunk_scan", ssd_token_by_token, ["fp32", "bf16"], seed).values()) == {Status.PASS}
    assert set(_run("causal_conv1d_fwd", conv_fwd_by_updates, ["fp32", "bf16"], seed).values()) == {Status.PASS}


@pytest.mark.parametrize(("op", "defect"), [(op, d) for op, ds in DEFECTS.items() for d in ds])
def test_planted_defects_are_caught(op: str, defect: str) -> None:
    wrong = DEFECTS[op][defect](get_op(op).native)
    assert _run(op, wrong, ["fp32", "bf16"]) == {"fp32": Status.FAIL, "bf16": Status.FAIL}, defect


def test_threshold_inputs_sit_around_the_softplus_switch() -> None:
    from adaptcheck.steps.ops.families.mamba import SsuCase

    case = SsuCase.model_validate(CASES["selective_state_update"][1])
    notes = get_op("selective_state_update").make_inputs(case, "fp16", torch.Generator().manual_seed(1)).notes
    top, low = float(str(notes["dt_plus_bias_max"])), float(str(notes["step_size_min"]))
    assert top > 20.0 and low > 15.0
    # Where softplus is computed as log(1 + e^v) in fp16, e^v overflows there.
    assert torch.isinf(torch.exp(torch.tensor(top, dtype=torch.float16)))


def test_groups_must_divide_heads() -> None:
    from adaptcheck.steps.ops.families.mamba import SsuCase

    with pytest.raises(ValueError, match="divisible"):
        SsuCase.model_validate({"name": "x", "batch": 1, "heads": 6, "head_dim": 4, "state_size": 4, "groups": 4})


@pytest.mark.slow  # imports vLLM (~30 s on a 2-core CI machine)
def test_vllm_kernels_pass_and_planted_defects_around_them_fail() -> None:
    """One vLLM import for the module: every Mamba2 op through vLLM in all dtypes, and one
    defect per op planted around the vLLM adapter."""
    pytest.importorskip("vllm")
    from adaptcheck.steps.ops.providers.vllm_provider import MAPPINGS, VllmProvider

    provider = VllmProvider()
    assert provider.available() == (True, "")
    for op in CASES:
        assert set(_run_provider(provider, op, ALL).values()) == {Status.PASS}, op
    for op, defect in (("selective_state_update", "state reset to the first state each step"),
                       ("causal_conv1d_update", "conv state rolled the wrong way"),
                       ("causal_conv1d_fwd", "conv taps reversed"),
                       ("ssd_chunk_scan", "dt_bias ignored")):
        wrong = DEFECTS[op][defect](MAPPINGS[op].fn)
        assert _run(op, wrong, ["fp32"]) == {"fp32": Status.FAIL}, (op, defect)
